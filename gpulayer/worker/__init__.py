"""The worker side: capability detection, registry heartbeat, job runtime."""

"""State in Redis: key names, the worker registry, Lua scripts."""

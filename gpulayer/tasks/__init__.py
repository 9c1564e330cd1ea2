"""Celery tasks: ``submit`` runs one job; the gang coordinator places distributed jobs."""

"""A runnable Celery project: three managers that never process a request twice."""

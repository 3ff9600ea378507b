"""A runnable Celery project: pending / process / callback managers that never process a request twice."""

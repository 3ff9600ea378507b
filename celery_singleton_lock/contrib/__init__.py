"""Operations around the lock: the app's locks as rows, liveness, CLI, metrics, test helpers."""

"""Limits on a name: holders at once (slots), a rate (GCRA), calls waiting, operators' overrides."""

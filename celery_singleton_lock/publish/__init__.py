"""The producer's side: a call becomes a held message (the gate, the hold taken in the
broker's push, retries sent on)."""

"""Foundation: validation, float64 scopes, XLA options, result records, I/O, progress (private)."""

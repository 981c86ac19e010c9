"""Small real models for drafter validation (notebook 01): target LM, DFlash-style drafter, training,
speculative decoding."""

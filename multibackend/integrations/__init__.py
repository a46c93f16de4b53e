"""multibackend inside other frameworks: the registered torch operator."""

"""fusegrad's version: the root package re-exports it, and the caches that must not outlive a
release (kernel disk cache, AOT artifacts) key on it."""

__version__ = "0.1.0"

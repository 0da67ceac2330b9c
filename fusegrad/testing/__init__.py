"""Testing tools: a random-program generator and a differential fuzzer (``fusegrad.testing.fuzz``)."""

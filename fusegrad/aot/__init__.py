"""Ahead-of-time compilation: a function or a whole training step saved as one file.

``fusegrad.aot.compile(fn, *example_args)`` traces and compiles without running; the
:class:`Artifact` it returns holds the graph's text, the plan (signature, state, kernels,
buffers), every kernel's object code for the target CPU and, optionally, the initial state.
``artifact.save(path)`` writes one checksummed file (:mod:`fusegrad.aot.format`, described
in docs/aot.md); ``fusegrad.aot.load(path)`` verifies it and links the object code into a
callable, with no tracing and no LLVM optimization or code generation::

    art = fusegrad.aot.compile(step, x, y)        # step: zero_grad, forward, backward, step
    art.save("step.fgaot")
    run = fusegrad.aot.load("step.fgaot")         # in another process, on another machine
    loss = run(x, y)                              # parameters and optimizer state updated

``dynamic_shapes={"x": {0: fusegrad.aot.Dim("batch", max=512)}}`` (torch.export's
spelling) saves one program for every batch size within the bounds.

``fusegrad-aot show FILE`` prints an artifact; ``fusegrad-aot compile module:function``
builds one from the command line.
"""

from fusegrad.aot.artifact import X86_64_LEVELS, Artifact, LoadedArtifact, compile, load, loads
from fusegrad.aot.dims import Dim
from fusegrad.aot.format import FORMAT_VERSION, ArtifactError

__all__ = ["compile", "load", "loads", "Dim", "Artifact", "LoadedArtifact", "ArtifactError",
           "FORMAT_VERSION", "X86_64_LEVELS"]

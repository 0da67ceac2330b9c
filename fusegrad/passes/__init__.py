"""Graph passes and the pass manager (``PassManager("simplify,cse,dce")``)."""

from fusegrad.passes.manager import PASSES, Pass, PassManager, PipelineError, parse_pipeline, register_pass

# isort: split
# Every pass module registers its passes by name into PASSES when imported.
from fusegrad.passes import builtin  # noqa: E402

__all__ = ["PASSES", "Pass", "PassManager", "PipelineError", "parse_pipeline", "register_pass"]

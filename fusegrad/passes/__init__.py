"""Graph passes and the pass manager (``PassManager("simplify,cse,dce")``)."""

from fusegrad.passes.manager import PASSES, Pass, PassManager, PipelineError, parse_pipeline, register_pass

__all__ = ["PASSES", "Pass", "PassManager", "PipelineError", "parse_pipeline", "register_pass"]

"""docs/supported.md is generated from fusegrad's namespaces and op registry; it must not drift."""

from pathlib import Path

from fusegrad.testing.supported_api import fusegrad_names, supported_markdown
from fusegrad.torch_api import NAMESPACES, torch_names

DOC = Path(__file__).resolve().parent.parent / "docs" / "supported.md"


def test_committed_supported_doc_is_up_to_date():
    assert DOC.read_text() == supported_markdown(), (
        "docs/supported.md is stale: regenerate it with "
        "`python -m fusegrad.testing.supported_api > docs/supported.md`")


def test_doc_counts_what_fusegrad_has():
    text = supported_markdown()
    for namespace in NAMESPACES:
        have = len(torch_names(namespace) & fusegrad_names(namespace))
        assert f"| `{namespace}` |" in text
        assert f"Has {have} of torch's {len(torch_names(namespace))} names" in text
    # Names implemented today are listed as present, names fusegrad lacks as missing.
    section = text.split("## `torch.nn.functional`")[1].split("## ")[0]
    has, missing = section.split("Missing")[:2]
    assert "`cross_entropy`" in has and "`conv2d`" in has and "`ctc_loss`" in missing
    assert "`ctc_loss`" not in has

"""torch.nn.modules.utils's helper for checkpoints saved under a wrapper's prefix."""

from __future__ import annotations

from typing import Any

__all__ = ["consume_prefix_in_state_dict_if_present"]


def consume_prefix_in_state_dict_if_present(state_dict: dict[str, Any], prefix: str) -> None:
    """Strip ``prefix`` from the keys of ``state_dict`` that have it, in place (torch's).

    A checkpoint of a compiled model (keys ``_orig_mod.fc.weight``) or of a data-parallel
    one (``module.fc.weight``) then loads into the plain model::

        sd = compiled.state_dict()
        consume_prefix_in_state_dict_if_present(sd, "_orig_mod.")
        model.load_state_dict(sd)
    """
    for key in list(state_dict.keys()):
        if key.startswith(prefix):
            state_dict[key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in list(metadata.keys()):
            # '' is the wrapper's own entry; 'module' and 'module.x' the wrapped model's.
            if key and (key == prefix.replace(".", "") or key.startswith(prefix)):
                metadata[key[len(prefix):]] = metadata.pop(key)

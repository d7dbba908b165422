"""The tutorials' quick output blocks (no training: `tfps plan`, the Slurm script) are what
their commands print today (docs/gen_outputs.py --check, about 2 s)."""

from __future__ import annotations

import sys

import docblocks
import pytest

sys.path.insert(0, str(docblocks.DOCS))
import gen_outputs  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("key", [k for k, o in gen_outputs.OUTPUTS.items() if o.quick])
def test_the_quick_outputs_are_current(key):
    body = gen_outputs.run(key)
    assert gen_outputs.same(gen_outputs.blocks(gen_outputs.OUTPUTS[key].page)[key], body), \
        f"docs/{gen_outputs.OUTPUTS[key].page}: the {key} output is stale; run python docs/gen_outputs.py --only {key}"

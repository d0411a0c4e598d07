"""The ingest flow's source parameters: names that keep different data apart."""

import pytest
from pydantic import ValidationError

from flows.params import IngestSource


def test_a_penalised_generation_gets_its_own_dataset_name():
    plain = IngestSource(task="safe-hopper@1.1.0", quality="medium")
    penalised = IngestSource(task="safe-hopper@1.1.0", quality="medium", cost_penalty=4)
    assert plain.dataset_name() == "safe-hopper-1.1.0-medium"
    assert penalised.dataset_name() == "safe-hopper-1.1.0-medium-penalty4"
    assert IngestSource(task="safe-hopper", cost_penalty=4, name="mine").dataset_name() == "mine"
    with pytest.raises(ValidationError, match="cost_penalty"):
        IngestSource(cost_penalty=-1)

"""The results file's JSON Schema (docs/results.schema.json) is the contract: the stored 0.1.0
file and what the typed model writes validate against it, and it rejects what is not results."""

import json
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "results.schema.json").read_text())


def validate(doc):
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)


def test_the_schema_is_a_valid_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_stored_file_and_the_models_output_validate():
    from pytest_llmspeed.results import load

    doc = json.loads((ROOT / "tests" / "data" / "v1" / "results.json").read_text())
    validate(doc)
    validate(load(ROOT / "tests" / "data" / "v1" / "results.json").to_document())
    older = ROOT / "tests" / "data" / "older_rule" / "results.json"  # verdicts of an older rule
    validate(json.loads(older.read_text()))
    validate(load(older).to_document())


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(schema="pytest-llmspeed/results/v2"),
        lambda d: d["cells"][0].update(status="great"),
        lambda d: d["cells"][0].update(id="decode[1K]"),
        lambda d: d["cells"][2].pop("reason"),  # a cell not run says why
        lambda d: d["cells"][5].pop("total_tok_s"),  # a valid decode cell has its figures
        lambda d: d["run"]["settings"].update(api_key="sk-secret"),
    ],
)
def test_the_schema_rejects(change):
    doc = json.loads((ROOT / "tests" / "data" / "v1" / "results.json").read_text())
    change(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


#: the JSON types a figure's Python type is written as
JSON_TYPE = {
    float: "number",
    int: "integer",
    str: "string",
    bool: "boolean",
    dict: "object",
    tuple: "array",
}
#: a cell's keys that are not figures: what it is, how it ended, its structure, the gate's
NOT_FIGURES = {
    "id", "phase", "context", "context_tokens", "context_display", "concurrency", "status",
    "reason", "samples", "replica_tok_s", "flags", "notes", "baseline", "baseline_checks",
    "attempts", "server", "baseline_why", "baseline_not_gated", "baseline_budget_cut",
}  # fmt: skip


def test_the_schema_describes_every_figure_of_the_list_and_no_other():
    from pytest_llmspeed import figures

    cell = SCHEMA["$defs"]["cell"]["properties"]
    for f in figures.FIGURES:
        described = cell[f.key]
        if "enum" not in described:  # words from a fixed set: their own enum
            types = described["type"]
            assert JSON_TYPE[f.kind] in ([types] if isinstance(types, str) else types), f.key
        if f.ci:
            assert cell[f.ci_key]["maxItems"] == 2, f.key
    named = {f.key for f in figures.FIGURES} | {f.ci_key for f in figures.with_interval()}
    assert set(cell) - named == NOT_FIGURES
    metric = cell["baseline_checks"]["items"]["properties"]["metric"]["enum"]
    assert metric == [f.key for f in figures.gated()]

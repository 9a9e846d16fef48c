"""Record encoding: every record names its schema version, and older versions stay readable."""

import io
import json
import shutil

import fastavro
import pytest

from broker import wire

TRANSITION = {"kind": "acked", "queue": "Q", "at_ms": 5, "bookmark": "T/0/1"}


def journal_part(**transition) -> dict:
    return {"batch": 1, "part": 0, "parts": 1, "written_ms": 9, "marker": None, "inputs": [],
            "transitions": [{**TRANSITION, **transition}]}


def test_a_record_carries_the_fingerprint_of_its_schema_and_reads_back():
    data = wire.encode("journal", journal_part(principal="p"))
    assert data.startswith(wire.MARKER)
    assert wire.decode("journal", data)["transitions"][0]["principal"] == "p"


def test_a_record_written_before_versions_were_marked_still_reads():
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, wire.schema("journal"), journal_part())
    assert wire.decode("journal", buf.getvalue())["transitions"][0]["kind"] == "acked"


def test_a_record_of_an_older_released_schema_reads_with_the_new_fields_defaulted(
        tmp_path, monkeypatch):
    old = json.loads((wire._schema_dir() / "journal.avsc").read_text())
    record = next(f for f in old["fields"] if f["name"] == "transitions")["type"]["items"]
    record["fields"] = [f for f in record["fields"] if f["name"] not in ("principal", "browse")]
    shutil.copytree(wire._schema_dir(), tmp_path / "schemas")
    (tmp_path / "schemas" / "history" / "journal.0.avsc").write_text(json.dumps(old))
    monkeypatch.setattr(wire, "_schema_dir", lambda: tmp_path / "schemas")
    wire.versions.cache_clear()
    try:
        parsed = fastavro.parse_schema(old)
        buf = io.BytesIO(wire.MARKER + wire._fingerprint_of(parsed))
        buf.seek(0, 2)
        fastavro.schemaless_writer(buf, parsed, journal_part())
        (t,) = wire.decode("journal", buf.getvalue())["transitions"]
        assert (t["kind"], t["browse"], t["principal"]) == ("acked", False, None)
    finally:
        wire.versions.cache_clear()


def test_a_record_of_an_unknown_schema_version_is_refused_with_the_reason():
    data = wire.MARKER + b"\x01" * 8 + b"\x00"
    with pytest.raises(ValueError, match="schema version it does not know.*newer kq"):
        wire.decode("command", data)


@pytest.mark.parametrize("name", sorted(p.stem for p in wire._schema_dir().glob("*.avsc")))
def test_every_current_schema_is_kept_among_the_released_versions(name):
    # so the version written today can be read after the next change of the schema
    current = wire._fingerprint_of(wire.schema(name))
    kept = {wire._fingerprint_of(fastavro.parse_schema(json.loads(p.read_text())))
            for p in (wire._schema_dir() / "history").glob(f"{name}.*.avsc")}
    assert current in kept, f"copy schemas/{name}.avsc to schemas/history/{name}.N.avsc"

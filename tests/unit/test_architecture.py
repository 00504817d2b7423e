"""The architecture's figures stay where the seams put them (tools/arch_figures.py counts them from the source):
backends are chosen in one dispatch, not by string comparisons spread through services/ and cli/; services return
typed results, not dicts; no verb imports another verb, and the import-linter contract that says so lists every
verb module."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO
from tests.infra.scripts import load_script

figures = load_script("tools/arch_figures.py", "miles_ray_arch_figures")


def test_backend_comparisons_are_the_dispatch_only():
    found = figures.figures()["backend_comparisons"]
    assert len(found) <= 6, found


def test_services_return_typed_results():
    found = figures.figures()["dict_results"]
    assert len(found) <= 3, found


def test_ray_is_spoken_to_over_http_by_the_run_controllers_client_only():
    assert figures.figures()["ray_http_modules"] == ["miles_ray/controller/ray_http.py"]


def test_no_verb_imports_another_verb():
    assert figures.figures()["verb_imports"] == []


def test_one_progress_type():
    assert figures.figures()["progress_definitions"] == ["miles_ray/core/progress.py"]


def test_the_verb_contract_lists_every_verb_module():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [verbs] = [c for c in contracts if c["name"].startswith("a verb does not import another verb")]
    on_disk = {f"miles_ray.cli.{p.stem}" for p in (REPO / "miles_ray" / "cli").glob("*.py")
               if p.stem not in figures.CLI_SHARED}
    assert set(verbs["modules"]) == on_disk


def test_the_counters_see_what_they_count(tmp_path):
    """Each counter finds a planted case (so a zero above means none, not a counter that sees nothing)."""
    services = tmp_path / "s.py"
    services.write_text('def up(b) -> dict[str, int]:\n    return {} if b == "local" else {}\n'
                        'def _private() -> dict:\n    return {}\n'
                        'def pair() -> tuple[int, dict]:\n    return 1, {}\n'
                        'def ok(x) -> int:\n    return 1 if x is Via.kuberay else 2\n'
                        'Progress = int\n')
    rel = services.relative_to(tmp_path)
    figures.REPO = tmp_path  # relative paths in the findings
    try:
        assert figures.backend_comparisons([services]) == [(str(rel), 2), (str(rel), 8)]
        assert figures.dict_results([services]) == [(str(rel), "up"), (str(rel), "pair")]
        assert figures.progress_definitions([services]) == [str(rel)]
        cli = tmp_path / "cli"
        cli.mkdir()
        (cli / "up.py").write_text("from miles_ray.cli.render import build\nfrom miles_ray.cli.views import x\n")
        (cli / "render.py").write_text("import miles_ray.cli.common\n")
        (cli / "views.py").write_text("")
        assert figures.verb_imports(cli) == [("up", "render")]
    finally:
        figures.REPO = REPO


def test_the_new_counters_see_what_they_count(tmp_path):
    """The issue-39 figures (record keys, Ray HTTP, largest module, supervision, Polyaxon resolutions) each find a
    planted case and leave alone what they do not count."""
    runs = tmp_path / "runs.py"
    runs.write_text("class RunRecord(BaseModel):\n    model_config = 1\n    schema_: str = Field('v', alias='schema')\n"
                    "    run: str\n    head: dict | None = None\n")
    fields = figures.record_fields(runs)
    assert fields == {"schema", "run", "head"}
    assert {"schema", "run", "attempts", "polyaxon_host"} <= figures.record_fields(REPO / "miles_ray/core/records/run.py")
    mod = tmp_path / "m.py"
    mod.write_text('"""Ray at /api/jobs/ (a docstring)."""\n'
                   'def f(rec, sid):\n    rec["run"] = rec.get("head")\n    if "schema" in rec:\n'
                   '        rec.pop("run")\n    other["name"], rec.get("nope")\n'
                   '    return f"{sid}/api/v0/nodes?limit=1"\n'
                   'def poly():\n    return "/api/v1/orgs"\n'
                   'def head_lost():\n    PolyaxonApi(host=cfg.polyaxon_host)\n'
                   '    polyaxon_api.PolyaxonApi(rec.polyaxon_host)\n'
                   '    PolyaxonApi(host=rec.get("polyaxon_host"), retries=1)\n    PolyaxonApi()\n')
    plain = tmp_path / "plain.py"
    plain.write_text('"""Nothing: /api/jobs/ in a docstring."""\nx = "/api/v1/runs"\n')
    named = tmp_path / "supervisor_thing.py"
    named.write_text("x = 1\n")
    figures.REPO = tmp_path
    try:
        rel = "m.py"
        assert figures.record_key_accesses([mod], fields) == [(rel, 3, "head"), (rel, 3, "run"), (rel, 4, "schema"),
                                                              (rel, 5, "run")]
        assert figures.ray_http_modules([mod, plain]) == [rel]
        assert figures.largest_modules([plain, mod, tmp_path / "data.json"]) == [(rel, 14), ("plain.py", 2)]
        assert figures.supervision_files([mod, plain, named]) == [rel, "supervisor_thing.py"]
        assert figures.polyaxon_resolutions([mod]) == [
            (".polyaxon_host", ["m.py:11", "m.py:12"]), ("<environment>", ["m.py:14"]),
            ("rec.get('polyaxon_host')", ["m.py:13"])]
    finally:
        figures.REPO = REPO


# string-key accesses of run-record fields outside the record's own package (issue 39: from 401; the target is
# <= 60, not reached yet: see the count's findings with 'python tools/arch_figures.py -v')
RECORD_KEY_LIMIT = 125


def test_run_record_fields_are_read_as_attributes():
    found = figures.figures()["record_key_accesses"]
    assert len(found) <= RECORD_KEY_LIMIT, found


def test_a_planted_record_key_access_breaks_the_limit(tmp_path):
    """One more ``record["field"]`` anywhere in the product is over the limit (the count is at the limit)."""
    planted = tmp_path / "planted.py"
    planted.write_text('def f(record):\n    return record["polyaxon_run_uuid"], record.get("attempts")\n')
    fields = figures.record_fields(REPO / "miles_ray/core/records/run.py")
    figures.REPO = tmp_path
    try:
        more = figures.record_key_accesses([planted], fields)
    finally:
        figures.REPO = REPO
    assert more == [("planted.py", 2, "attempts"), ("planted.py", 2, "polyaxon_run_uuid")]
    assert len(figures.figures()["record_key_accesses"]) + len(more) > RECORD_KEY_LIMIT


def test_one_way_to_say_where_a_polyaxon_run_lives():
    found = figures.figures()["polyaxon_resolutions"]
    assert [way for way, _ in found] == [".host"], found

"""What README.md and deploy/README.md state that a test can check: the sensors and schedules
they name exist (and the number the first start counts), the environment variables the
deployed code reads are the ones the guide lists, the run queue's limit is the one the guide
shows, the tags the guide says each job's runs carry from their definitions, and the health
checks' setting, grace and error code."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import yaml

from media_usage_orchestration import definitions
from media_usage_orchestration.assets.health import RUN_START_GRACE_SECONDS
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG, QUEUE_TAG
from media_usage_orchestration.jobs import media_usage_reconciliation, media_usage_work
from media_usage_orchestration.ops.instance_pruning import PruneInstanceConfig
from media_usage_orchestration.resources.automation import MediaUsageAutomation
from media_usage_orchestration.sensors.alerts import ALERT_SENSOR_INTERVAL_SECONDS
from media_usage_orchestration.sensors.work import HANDOVER_LEAD_SECONDS
from media_usage_orchestration.values.errors import AlertNotDelivered

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text("utf-8")
GUIDE = (ROOT / "deploy" / "README.md").read_text("utf-8")
DEPLOY_YAML = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text("utf-8"))
NUMBERS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10,
}  # fmt: skip
PACKAGE = "media_usage_orchestration"


def _repository():
    return definitions.defs.get_repository_def()


def test_every_sensor_and_schedule_the_guides_name_exists():
    repository = _repository()
    known = {sensor.name for sensor in repository.sensor_defs} | {
        schedule.name for schedule in repository.schedule_defs
    }
    named = set(re.findall(r"media_usage_[a-z_]+_(?:sensor|schedule)\b", README + GUIDE))
    assert named and named <= known, sorted(named - known)
    # Every sensor is documented in the README's table of what runs by itself.
    assert {sensor.name for sensor in repository.sensor_defs} <= named


def test_the_first_start_counts_the_sensors():
    (word,) = re.findall(r"the project's (\w+) sensors as STOPPED", GUIDE)
    assert NUMBERS[word] == len(_repository().sensor_defs)


def test_the_guide_lists_the_environment_variables_the_deployed_code_reads():
    (sentence,) = re.findall(r"The project itself reads (\w+) variables: ([^.]+)\.", GUIDE)
    word, names = sentence
    listed = set(re.findall(r"`(MEDIA_USAGE_[A-Z_]+)`", names))
    read = environment_variables_read()
    assert listed == read
    assert NUMBERS[word] == len(read)
    table = set(re.findall(r"^\| `(MEDIA_USAGE_[A-Z_]+)`", GUIDE, flags=re.MULTILINE))
    assert read <= table  # each has its row in the table of variables


def environment_variables_read() -> set[str]:
    """The `MEDIA_USAGE_*` variables read (`os.environ.get`, `os.environ[...]`, `os.getenv`)
    by the modules a code location loads: `definitions` and everything it imports."""
    importlib.import_module(f"{PACKAGE}.definitions")
    modules = [
        module
        for name, module in sys.modules.items()
        if name.startswith(PACKAGE) and getattr(module, "__file__", None)
    ]
    found: set[str] = set()
    for module in modules:
        tree = ast.parse(Path(module.__file__).read_text("utf-8"))
        for node in ast.walk(tree):
            name = _read_variable(node)
            if name is None:
                continue
            value = name if isinstance(name, str) else getattr(module, name.id, None)
            if isinstance(value, str) and value.startswith("MEDIA_USAGE_"):
                found.add(value)
    return found


def _read_variable(node: ast.AST) -> str | ast.Name | None:
    """The variable a node reads from the environment: a literal, or the constant it names."""
    argument = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        target = ast.unparse(node.func)
        if target in ("os.environ.get", "os.getenv") and node.args:
            argument = node.args[0]
    elif (
        isinstance(node, ast.Subscript)
        and ast.unparse(node.value) == "os.environ"
        and isinstance(node.ctx, ast.Load)
    ):
        argument = node.slice
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value
    return argument if isinstance(argument, ast.Name) else None


def test_the_run_queue_limit_is_the_one_the_guide_shows():
    limits = DEPLOY_YAML["concurrency"]["runs"]["tag_concurrency_limits"]
    assert limits == [{"key": QUEUE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]
    assert f"- key: {QUEUE_TAG}" in GUIDE


def test_the_tags_the_guide_says_each_job_carries():
    rows = dict(re.findall(r"^\| `(media_usage_[a-z_]+)` \| `([a-z]+:<slug>)` \|", GUIDE, re.M))
    slug = "articles"
    reconciliation = media_usage_reconciliation.partitioned_config.get_tags_for_partition_key(
        slug, media_usage_reconciliation.name
    )
    assert reconciliation[QUEUE_TAG] == rows["media_usage_reconciliation"].replace("<slug>", slug)
    assert reconciliation[COLLECTION_TAG] == slug
    # The deletion sensor's tag is checked where its requests are made (a database is needed):
    # tests/dagster/test_sensor_hold_back.py.
    assert rows["media_usage_collection_deletion"] == "deletion:<slug>"
    assert re.search(r"^\| `media_usage_work` \| none \|", GUIDE, re.M)
    assert QUEUE_TAG not in media_usage_work.tags
    assert media_usage_work.tags["dagster/max_retries"] == "0"


def test_the_health_settings_and_codes_the_guides_name_exist():
    setting = MediaUsageAutomation.model_fields["queue_stall_seconds"]
    for guide in (README, GUIDE):
        assert "`queue_stall_seconds`" in guide
        assert f"default {setting.default:g}" in guide or f"default {setting.default:g} s" in guide
    assert f"about {RUN_START_GRACE_SECONDS:g} s" in GUIDE
    assert f"more than {RUN_START_GRACE_SECONDS:g} s" in README
    assert AlertNotDelivered.code in README and AlertNotDelivered.code in GUIDE
    assert f"`media_usage_alert_sensor` (every {ALERT_SENSOR_INTERVAL_SECONDS:g} s" in README
    assert f"next tick (every\n{ALERT_SENSOR_INTERVAL_SECONDS:g} s)" in GUIDE


def test_the_tick_history_the_guide_states_is_the_files():
    sensor = DEPLOY_YAML["retention"]["sensor"]["purge_after_days"]
    schedule = DEPLOY_YAML["retention"]["schedule"]["purge_after_days"]
    assert schedule == sensor["failure"]
    stated = (
        f"skipped sensor ticks after {sensor['skipped']} day,\n  sensor ticks that launched "
        f"runs after {sensor['success']}, failed sensor ticks and every schedule tick after\n"
        f"  {sensor['failure']}."
    )
    assert stated in GUIDE


def test_the_pruning_ages_the_guides_state_are_the_jobs_defaults():
    fields = PruneInstanceConfig.model_fields
    success, failure = fields["success_days"].default, fields["failure_days"].default
    most = fields["max_runs"].default
    guide = " ".join(GUIDE.split())
    assert f"at most {most:,} runs a run): finished runs of the project past {success:g}" in guide
    assert f"days (SUCCESS, CANCELED) or {failure:g} days (FAILURE)" in guide
    assert f"`success_days` {success:g}, `failure_days` {failure:g}" in README


def test_the_work_budget_the_guides_state_is_the_automations_default():
    budget = MediaUsageAutomation.model_fields["work_seconds_per_run"].default
    assert f"(`work_seconds_per_run`, default {budget:g} s)" in " ".join(GUIDE.split())
    assert f"(`work_seconds_per_run`, default {budget:g} s)" in " ".join(README.split())


def test_the_handover_lead_the_readme_states_is_the_sensors():
    assert f"in the last {HANDOVER_LEAD_SECONDS:g} s of its budget" in README
    assert f"in the last {HANDOVER_LEAD_SECONDS:g} s of its budget" in GUIDE
    assert f"in its budget's last {HANDOVER_LEAD_SECONDS:g} s" in GUIDE


def _layout_block() -> str:
    start = README.index("## Layout")
    return README[README.index("```", start) : README.index("```", README.index("```", start) + 3)]


def test_the_layout_names_every_folder_and_every_room_of_store_and_processing():
    layout = _layout_block()
    package = ROOT / PACKAGE
    # bench/ is named on the command's line (`bench/ the benchmark`).
    folders = {p.parent.name for p in package.glob("*/__init__.py")} - {"bench"}
    assert {f for f in folders if not re.search(rf"^  {f}/ ", layout, re.M)} == set()
    for layer in ("store", "processing"):
        rooms = {p.parent.name for p in (package / layer).glob("*/__init__.py")}
        block = layout[layout.index(f"  {layer}/") :]
        block = block[: re.search(r"\n  \S", block[3:]).start() + 3]
        assert {room for room in rooms if f"{room}/" not in block} == set(), layer

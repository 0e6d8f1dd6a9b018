"""The names operators, run keys and the UI depend on, asserted literally.

Renaming a sensor or its code location resets the daemon's run-key dedup; renaming a job, an
op or an output orphans run history, re-execution from failure (outputs are found by step
and output name) and backfills (partition sets are named after jobs); renaming the dynamic
partitions definition loses every collection partition. Change these only on purpose.
"""

import itertools

import dagster as dg

from media_usage_orchestration.assets.coverage_history import coverage_assets
from media_usage_orchestration.dagster_kit.run_tags import COLLECTION_TAG, OUTCOME_TAG
from media_usage_orchestration.definitions import defs
from media_usage_orchestration.sensors.common import COLLECTION_ID_TAG

JOBS = {
    "media_usage_activation": ["activate_capture"],
    "media_usage_collection_deletion": [
        "claim_deletion",
        "fence",
        "remove_registry",
        "drop_table",
        "delete_work",
        "delete_sources",
        "delete_status",
        "finalize_deletion",
    ],
    "media_usage_maintenance": ["settle_and_seed_reconciliations", "sync_collection_partitions"],
    "media_usage_reconciliation": [
        "claim_reconciliation",
        "prepare_run",
        "scan_pages",
        "drain_collection_work",
        "scan_sources",
        "finalize_coverage",
    ],
    "media_usage_projection_gc": ["collect_projection_garbage", "summarize_media_library"],
    "media_usage_instance_pruning": ["prune_instance"],
    "media_usage_work": ["drain_due_work"],
    "request_collection_deletion": ["request_deletion"],
    "retry_collection_deletion": ["reopen_collection_deletion"],
    "retry_media_usage_work": ["reopen_failed_work"],
    "retry_media_usage_reconciliation": ["reopen_reconciliation"],
}
WORKFLOW_TAGS = {
    "media_usage_activation": "activation",
    "media_usage_collection_deletion": "collection_deletion",
    "media_usage_maintenance": "maintenance",
    "media_usage_reconciliation": "reconciliation",
    "media_usage_projection_gc": "projection_gc",
    "media_usage_instance_pruning": "instance_pruning",
    "media_usage_work": "work",
    "request_collection_deletion": "collection_deletion_request",
    "retry_collection_deletion": "operator",
    "retry_media_usage_work": "operator",
    "retry_media_usage_reconciliation": "operator",
}
SENSORS = {
    # Launches no runs: it posts to a webhook when a check turns failing or recovers. Renaming it
    # resets its cursor, so the checks failing then are announced once more.
    "media_usage_alert_sensor": (None, 10),
    "media_usage_collection_deletion_sensor": ("media_usage_collection_deletion", 30),
    "media_usage_projection_gc_sensor": ("media_usage_projection_gc", 60),
    "media_usage_queue_sensor": (None, 30),  # observes the queue assets, launches no run
    "media_usage_reconciliation_sensor": ("media_usage_reconciliation", 30),
    "media_usage_work_sensor": ("media_usage_work", 3),
    # Launches no runs: it reports check evaluations and reopens work the work sensor runs.
    "media_usage_scrubber_sensor": (None, 30),
    # Launches no runs: it fails runs whose worker is gone (their run lease expired).
    "media_usage_run_health_sensor": (None, 10),
}
SCHEDULES = {
    "media_usage_maintenance_schedule": ("media_usage_maintenance", "*/2 * * * *", "UTC"),
    "media_usage_instance_pruning_schedule": ("media_usage_instance_pruning", "17 * * * *", "UTC"),
}
RESOURCES = ["automation", "database", "io_manager"]
PARTITIONS_DEF = "media_usage_collections"
LOCATION = "media_usage_orchestration"


def test_definitions_are_loadable():
    dg.Definitions.validate_loadable(defs)


def test_job_and_op_names():
    # `__ASSET_JOB` is Dagster's implicit job for the declared `media_usage_index` asset.
    jobs = {job.name: job for job in defs.resolve_all_job_defs() if not job.name.startswith("__")}
    assert {name: list(job.graph.node_names()) for name, job in jobs.items()} == JOBS
    assert {name: job.run_tags.get("media_usage/workflow") for name, job in jobs.items()} == (
        WORKFLOW_TAGS
    )
    assert {name: job.executor_def.name for name, job in jobs.items()} == dict.fromkeys(
        JOBS, "in_process"
    )


def test_the_coverage_asset_and_the_resource_keys():
    asset = defs.resolve_assets_def("media_usage_index")
    assert asset.partitions_def.name == PARTITIONS_DEF
    assert sorted(defs.resources) == RESOURCES
    assert "database" in defs.resources
    for key in ("media_usage_projection_cleanup", "media_usage_media_library"):
        assert defs.resolve_assets_def(key).partitions_def is None


def test_the_checks_are_defined_per_collection_asset_not_on_the_partitioned_index():
    # `defs` alone (no registry read) has no check: each collection's checks are declared with
    # its assets as the location loads (test_coverage_history.py, test_queue_sensor.py).
    assert list(defs.resolve_asset_graph().asset_check_keys) == []
    names = {check.name for check in coverage_assets(["blog"])[0].check_specs}
    assert names == {"coverage_complete"}
    [spec] = coverage_assets(["blog"])[0].check_specs
    assert (spec.asset_key.to_user_string(), spec.blocking) == ("media_usage_coverage/blog", False)


def test_the_reconciliation_graph_hands_the_claim_through_named_outputs():
    job = defs.resolve_job_def("media_usage_reconciliation")
    outputs = {
        node.name: sorted(output.name for output in node.definition.output_defs)
        for node in job.graph.nodes
    }
    assert outputs == {key: ["lease", "outcome"] for key in JOBS["media_usage_reconciliation"]}
    structure = job.graph.dependency_structure
    upstream = {
        name: {
            handle.input_name: [f"{output.node_name}.{output.output_def.name}" for output in outs]
            for handle, outs in structure.input_to_upstream_outputs_for_node(name).items()
        }
        for name in job.graph.node_names()
    }
    ops = JOBS["media_usage_reconciliation"]
    assert upstream == {
        ops[0]: {},
        **{op: {"lease": [f"{previous}.lease"]} for previous, op in itertools.pairwise(ops)},
    }


def test_sensor_schedule_resource_and_partition_names():
    assert {
        sensor.name: (sensor.job_name if sensor.targets else None, sensor.minimum_interval_seconds)
        for sensor in defs.sensors
    } == SENSORS
    assert {
        schedule.name: (schedule.job_name, schedule.cron_schedule, schedule.execution_timezone)
        for schedule in defs.schedules
    } == SCHEDULES
    assert sorted(defs.resources) == RESOURCES
    partitioned = {
        job.name: job.partitions_def.name
        for job in defs.resolve_all_job_defs()
        if job.partitions_def is not None
    }
    assert partitioned == {"media_usage_reconciliation": PARTITIONS_DEF}


def test_run_tag_keys():
    assert (COLLECTION_ID_TAG, COLLECTION_TAG, OUTCOME_TAG) == (
        "media_usage/collection_id",
        "media_usage/collection",
        "media_usage/outcome",
    )

"""The engines' launcher and checker (unifiedamp.conformance.engines), framework-free.

The rank programs here are plain Python: what is under test is how a run of
several processes ends (results, a raised error, a collective that times out, a rank
that never answers, an abort after the results) and how records are held against the
spec. A "collective" in them is a wait with a timeout that raises ``TimeoutError``,
which the program tells ``rank_main`` is its framework's collective timeout.
"""

from __future__ import annotations

import copy
import os
import re
import textwrap
import time

import numpy as np
import pytest

from unifiedamp.conformance import engines
from unifiedamp.conformance.engines import (
    DEFAULT_CONFIG,
    Outcome,
    check,
    default_kinds,
    expected_states,
    launch,
    step_record,
    verdict,
)
from unifiedamp.spec import ScalerConfig

PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    from unifiedamp.conformance.engines import rank_main, step_record

    def collective(job, ready):
        # As a framework's collective with a timeout: waits for ready(), then raises.
        start = time.monotonic()
        while not ready():
            if time.monotonic() - start > job["collective_timeout"]:
                raise TimeoutError(f"waited {job['collective_timeout']} s in a collective")
            time.sleep(0.05)

    def train(job):
        if job["mode"] == "hang" and job["rank"] == 1:
            time.sleep(600)
        if job["mode"] == "wait":  # every rank waits for the other, as in a collective
            collective(job, lambda: False)
        if job["mode"] == "busy":  # rank 1 waits for rank 0, which computes for 4 s
            done = os.path.join(job["out"], "done")
            if job["rank"] == 0:
                start = time.process_time()
                while time.process_time() - start < 4:
                    pass
                open(done, "w").close()
            collective(job, lambda: os.path.exists(done))
        if job["mode"] == "raise" and job["rank"] == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        if job["mode"] == "raise-then-wait":  # rank 1's peer is gone: its collective ends
            if job["rank"] == 0:
                raise AssertionError("No inf checks were recorded for this optimizer.")
            collective(job, lambda: False)
        if job["mode"] == "raise-then-hang":  # rank 1 waits with no timeout of its own
            if job["rank"] == 0:
                raise AssertionError("No inf checks were recorded for this optimizer.")
            time.sleep(600)
        if job["mode"] == "who":
            return [{"ppid": os.getppid(), "cwd": os.getcwd(), "out": job["out"],
                     "main": __name__, "argv0": sys.argv[0], "argc": len(sys.argv),
                     "var": os.environ.get("RANK_VAR"), "session": os.getsid(0) == os.getpid(),
                     "deadline": job["deadline"]}]
        return [step_record("F", (1024.0, 1, 0), True, [[job["rank"] * 0.0 + 0.5]])]

    if __name__ == "__main__":
        rank_main(train, timed_out=lambda exc: isinstance(exc, TimeoutError))
        if json.loads(sys.argv[1])["mode"] == "abort" and json.loads(sys.argv[1])["rank"] == 1:
            os.abort()
""")

#: A collective's timeout in the rank program (its "framework's"), in seconds.
COLLECTIVE_TIMEOUT = 2


@pytest.fixture
def program(tmp_path):
    """Launches the rank program as plain interpreters."""
    (tmp_path / "rank_program.py").write_text(PROGRAM)
    path = os.pathsep.join([str(tmp_path), engines._pythonpath()])

    def run(mode, collective_timeout=COLLECTIVE_TIMEOUT, **kw):
        return launch("rank_program", {"mode": mode, "collective_timeout": collective_timeout},
                      2, env=lambda rank: {"PYTHONPATH": path, **kw.pop("env", {})}, **kw)

    return run


def test_a_run_whose_ranks_all_finish_is_ok_with_each_ranks_records(program):
    outcome = program("ok")
    assert outcome.status == "ok", outcome
    assert [r["rank"] for r in outcome.records] == [0, 1]
    assert outcome.returncodes == [0, 0]
    assert outcome.records[1]["steps"][0]["scale"] == 1024.0


def test_a_rank_that_never_answers_is_a_deadlock_and_every_rank_is_killed(program):
    outcome = program("hang", timeout=6)
    assert outcome.status == "deadlock", outcome
    assert "rank(s) [1]" in outcome.detail and "6 s" in outcome.detail
    assert outcome.returncodes[1] < 0  # killed, not left running
    assert outcome.seconds < 30
    # where it waited: its threads' stacks (faulthandler), printed before it was killed
    assert re.search(r"rank_program\.py\", line \d+ in train", outcome.logs[1]), outcome.logs


def test_ranks_that_all_wait_are_a_deadlock_before_the_timeout_with_their_stacks(program):
    outcome = program("wait", timeout=120)
    assert outcome.status == "deadlock", outcome
    assert outcome.detail == ("a collective timed out on rank(s) [0, 1] (TimeoutError: waited "
                              "2 s in a collective); no result from rank(s) [0, 1]")
    assert outcome.seconds < 60
    # each rank's log ends with where it waited (the traceback of its collective's timeout)
    assert all(re.search(r"rank_program\.py\", line \d+, in train", log)
               for log in outcome.logs), outcome.logs


def test_a_rank_that_computes_while_its_peer_waits_is_no_deadlock(program):
    outcome = program("busy", timeout=120, collective_timeout=30)
    assert outcome.status == "ok", outcome


def test_a_rank_that_raises_is_an_error_naming_the_exception(program):
    outcome = program("raise", timeout=60)
    assert outcome.status == "error"
    assert outcome.detail == ("AssertionError: No inf checks were recorded for this "
                              "optimizer.")
    assert outcome.returncodes[0] == 1


def test_a_collective_that_times_out_after_a_peer_raised_leaves_that_error(program):
    # The first error in time decides: rank 1's collective timed out because rank 0 failed.
    outcome = program("raise-then-wait", timeout=60)
    assert outcome.status == "error", outcome
    assert outcome.detail == ("AssertionError: No inf checks were recorded for this "
                              "optimizer.")
    assert outcome.records[1]["timed_out"] and outcome.returncodes == [1, 1]


def test_the_peers_of_a_rank_that_raised_are_killed_after_the_grace(program):
    # Rank 1 would wait for rank 0 until the launch's timeout (as in a collective that takes
    # no timeout, JAX's and Paddle's on CPU): the launch ends it `grace` seconds after rank
    # 0 failed, timed from rank 0's own clock of its failure.
    grace = 3.0
    outcome = program("raise-then-hang", timeout=90, grace=grace)
    ended = time.time()
    assert outcome.status == "error", outcome
    assert outcome.detail == ("AssertionError: No inf checks were recorded for this "
                              "optimizer.")
    assert outcome.returncodes == [1, -9], outcome
    waited = ended - outcome.records[0]["at"]
    assert grace <= waited < grace + 10, f"rank 1 killed {waited:.1f} s after rank 0 failed"


def test_a_rank_that_aborts_after_its_results_is_an_abort_at_exit(program):
    outcome = program("abort", timeout=60)
    assert outcome.status == "abort at exit"
    assert outcome.detail == "rank 1: killed by SIGABRT"
    assert check(DEFAULT_CONFIG, ["F", "F"], outcome) == [
        "abort at exit: rank 1: killed by SIGABRT"]


def test_a_rank_is_what_python_m_makes_of_it_in_a_session_of_its_own(tmp_path):
    (tmp_path / "rank_program.py").write_text(PROGRAM)
    path = os.pathsep.join([str(tmp_path), engines._pythonpath()])
    before = time.time()
    outcome = launch("rank_program", {"mode": "who"}, 2, timeout=60,
                     env=lambda rank: {"PYTHONPATH": path, "RANK_VAR": f"r{rank}"})
    assert outcome.status == "ok", outcome
    for rank, record in enumerate(outcome.records):
        seen = record["steps"][0]
        assert seen["cwd"] == seen["out"] and seen["main"] == "__main__", seen
        assert seen["argv0"] == str(tmp_path / "rank_program.py") and seen["argc"] == 2
        assert seen["var"] == f"r{rank}" and seen["session"], seen
        # a child of this process (no server in between), told when the launch ends
        assert seen["ppid"] == os.getpid(), seen
        assert before + 60 <= seen["deadline"] <= time.time() + 60


def records_following_the_spec(config: ScalerConfig, kinds: list[str]) -> Outcome:
    """What a correct run records: the spec's states, the same weights on every rank,
    changed exactly at the steps every rank found finite."""
    weights, records = [0.5], [{"rank": r, "world": len(kinds), "steps": []}
                               for r in range(len(kinds))]
    for step, state in enumerate(expected_states(config, kinds)):
        stepped = not any(k[step] in "IN" for k in kinds)
        if stepped:
            weights = [weights[0] - 0.125]
        for record in records:
            record["steps"].append(step_record(kinds[record["rank"]][step], state, stepped,
                                               [weights]))
    return Outcome("ok", records)


def test_records_following_the_spec_pass():
    kinds = default_kinds(2)
    assert check(DEFAULT_CONFIG, kinds, records_following_the_spec(DEFAULT_CONFIG, kinds)) == []


@pytest.mark.parametrize(("plant", "problem"), [
    (lambda s: s.update(scale=2048.0), "step 3, rank 1: scale 2048.0, trackers 0, 0 "
                                       "(the spec: 256.0, 0, 0)"),
    (lambda s: s.update(growth=1), "step 3, rank 1: scale 256.0, trackers 1, 0"),
    (lambda s: s.update(stepped=True), "step 3, rank 1: stepped (the spec skips: an inf or "
                                       "NaN on a rank)"),
    (lambda s: s.update(weights=[0.375]), "step 3: the ranks' weights differ"),
    (lambda s: s.update(weights=[float("inf")]), "step 3, rank 1: non-finite weights"),
])
def test_each_departure_is_named_with_its_step_and_rank(plant, problem):
    kinds = default_kinds(2)
    outcome = records_following_the_spec(DEFAULT_CONFIG, kinds)
    plant(outcome.records[1]["steps"][3])
    problems = check(DEFAULT_CONFIG, kinds, outcome)
    assert problems and problems[0].startswith(problem), problems


def test_a_scale_off_by_one_float32_ulp_is_a_departure():
    kinds = ["FF", "FF"]
    config = ScalerConfig(1000.0, growth_factor=1.1, growth_interval=1)
    outcome = records_following_the_spec(config, kinds)
    good = np.float32(outcome.records[0]["steps"][0]["scale"])
    outcome.records[0]["steps"][0]["scale"] = float(np.nextafter(good, np.float32(np.inf)))
    assert check(config, kinds, outcome)[0].startswith("step 0, rank 0: scale")


def test_a_rank_without_gradients_is_expected_not_to_step():
    kinds = ["FF", "F-"]
    outcome = records_following_the_spec(DEFAULT_CONFIG, kinds)
    assert check(DEFAULT_CONFIG, kinds, outcome, replicas=False) == [
        "step 1, rank 1: stepped (the spec skips: every rank finite)"]
    outcome.records[1]["steps"][1]["stepped"] = False
    assert check(DEFAULT_CONFIG, kinds, outcome, replicas=False) == []


def test_weights_are_held_against_a_reference_within_rtol():
    kinds = ["FF", "FF"]
    outcome = records_following_the_spec(DEFAULT_CONFIG, kinds)
    reference = [[0.375], [0.25]]
    assert check(DEFAULT_CONFIG, kinds, outcome, reference=reference) == []
    wrong = copy.deepcopy(reference)
    wrong[1] = [0.25 * 1024]  # a step on gradients left scaled
    assert check(DEFAULT_CONFIG, kinds, outcome, reference=wrong) == [
        "step 1, rank 0: weights differ from a single process taking the spec's steps",
        "step 1, rank 1: weights differ from a single process taking the spec's steps"]


def test_the_verdict_is_the_first_problem():
    assert verdict([]) == "follows the spec"
    assert verdict(["a", "b", "c"]) == "a (and 2 more)"


def test_the_command_line_names_the_frameworks_and_refuses_others(capsys):
    assert engines.main([]) == 2
    assert "FRAMEWORK: torch, jax, tensorflow, paddle" in capsys.readouterr().err


USAGE = ("usage: python -m unifiedamp.conformance.engines FRAMEWORK [ENGINE SCALER]  "
         "(FRAMEWORK: torch, jax, tensorflow, paddle)")


@pytest.mark.parametrize("argv, error", [
    (["mxnet"], "unknown framework 'mxnet': one of torch, jax, tensorflow, paddle"),
    (["--version"], "unknown option '--version'"),
    (["torch", "--verbose"], "unknown option '--verbose'"),
    (["torch", "ddp"], "give FRAMEWORK, or FRAMEWORK ENGINE SCALER; got 2 arguments"),
])
def test_every_wrong_call_of_the_command_line_exits_2_with_what_is_wrong(argv, error, capsys):
    assert engines.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"{USAGE}\nerror: {error}\n"


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["torch", "--help"]])
def test_help_prints_the_usage_and_exits_0(argv, capsys):
    assert engines.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith(USAGE + "\nRuns ENGINE with SCALER") and err == ""
    assert out.endswith("\nexit status: 1 when the run departs from the spec, 2 for a usage "
                        "error.\n")


def test_python_m_help_exits_0(run_python):
    # The module's own exit status, as a shell sees it.
    proc = run_python("import unifiedamp.conformance.engines.__main__", args=("--help",))
    assert proc.returncode == 0 and proc.stdout.startswith(USAGE), proc.stderr


def test_the_command_line_lists_an_engines_settings_and_refuses_a_pairing_it_cannot_run(
        capsys):
    # Listing and refusing need no torch: the engine module imports it in its ranks only.
    assert engines.main(["torch"]) == 0
    listed = capsys.readouterr().out
    assert "fsdp2" in listed and "torch.amp" in listed
    assert engines.main(["torch", "ddp-hysteresis", "torch.amp"]) == 2
    assert "does not run with scaler 'torch.amp'" in capsys.readouterr().err
    assert engines.main(["torch", "fsdp3", "unifiedamp"]) == 2
    assert "unknown engine 'fsdp3' for torch" in capsys.readouterr().err

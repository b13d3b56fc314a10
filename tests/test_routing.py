"""Which way a call goes (speculative loop or generate()) and how many drafts a round verifies."""

import math

import numpy as np
import pytest

from ct2_flash import FlashWhisperModel
from ct2_flash.adapter.routing import (
    CONTINUED,
    FIRST_PROBE_INTERVAL,
    FIRST_PROBE_SECONDS,
    GENERATE,
    LOOP,
    MAX_PROBE_INTERVAL,
    CallRouter,
    RedecodeRouters,
)
from ct2_flash.loop.draft_lengths import DraftLengths

from .conftest import THREADS, segments_of


class ForcedGenerate(CallRouter):
    def use_loop(self, batch_size):
        return False


class ForcedSpeculation(CallRouter):
    def use_loop(self, batch_size):
        return True


def _run(router, calls, speculative_cost, generate_cost, call_seconds=FIRST_PROBE_SECONDS):
    """Drive the router with fixed per-token costs; returns the way each call went. A call of
    cost 1 takes ``call_seconds``: by default as long as the first probe's wait for
    ``generate()`` seconds, so that the calls alone decide when the loop is first probed."""
    ways = []
    for _ in range(calls):
        way = router.use_loop(1)
        ways.append(way)
        router.record(way, 1, call_seconds * (speculative_cost if way else generate_cost), 1)
    return ways


def test_generate_goes_first_then_the_loop_is_measured_and_a_close_loser_probed_rarely():
    """faster-whisper's own call first, so a process of a few calls is never slower; the loop
    is measured at the first probe; a close loser (2% slower) is probed soon, then at doubling
    intervals."""
    ways = _run(CallRouter(), 200, speculative_cost=1.02, generate_cost=1.0)
    assert ways[:FIRST_PROBE_INTERVAL] == [False] * FIRST_PROBE_INTERVAL
    assert ways[FIRST_PROBE_INTERVAL] is True  # the loop's first measurement
    probes = [i for i, way in enumerate(ways) if way]
    gaps = np.diff(probes)
    assert gaps[0] <= FIRST_PROBE_INTERVAL + 1  # the first probe of the loser comes soon
    assert gaps[1] == 2 * FIRST_PROBE_INTERVAL and all(b >= a for a, b in zip(gaps[1:], gaps[2:]))  # then rarer
    assert max(gaps) <= MAX_PROBE_INTERVAL + 1
    assert sum(ways) <= 8  # under 4% of 200 calls speculative


def test_a_process_of_few_calls_never_runs_the_loop_even_when_it_would_lose_badly():
    ways = _run(CallRouter(), FIRST_PROBE_INTERVAL, speculative_cost=3.0, generate_cost=1.0)
    assert not any(ways)


def test_the_first_probe_waits_until_generate_has_decoded_long_enough():
    """The loop's first call pays its one-time setup, so the first probe waits for
    FIRST_PROBE_SECONDS of generate() as well as FIRST_PROBE_INTERVAL calls: short calls (a
    folder of prompts) probe late, long ones at the interval."""
    short = FIRST_PROBE_SECONDS / 64  # a call's seconds: 64 calls reach the wait
    ways = _run(CallRouter(), 80, speculative_cost=2.0, generate_cost=1.0, call_seconds=short)
    assert ways.index(True) == 64
    ways = _run(CallRouter(), 40, speculative_cost=2.0, generate_cost=1.0)
    assert ways.index(True) == FIRST_PROBE_INTERVAL


def test_once_the_loops_setup_is_paid_the_first_probe_does_not_wait():
    """A re-decode or a decode that outgrew its audio paid the loop's setup (CallRoutes.setup_paid):
    the greedy router, and a sampling router made after, probe at the interval however short the calls."""
    from ct2_flash.adapter.routing import CallRoutes
    from ct2_flash.loop.options import DecodingOptions

    routes = CallRoutes()
    routes.mark_setup_paid()
    short = FIRST_PROBE_SECONDS / 64
    ways = _run(routes.greedy, 40, speculative_cost=2.0, generate_cost=1.0, call_seconds=short)
    assert ways.index(True) == FIRST_PROBE_INTERVAL
    sampled = routes.router_for(DecodingOptions(sampling_temperature=0.6, sampling_topk=0))
    assert sampled.setup_paid


@pytest.mark.parametrize(
    "loss, most_probes, most_overhead",
    [
        (0.3, 10, 0.012),  # a 30% loss: about one probe in 30 calls keeps the probes' cost near 1%
        (1.0, 5, 0.02),  # larger losses: never more often than one probe in 64 calls
        (3.0, 5, 0.06),
    ],
)
def test_probes_of_a_clear_loser_stay_within_the_budget(loss, most_probes, most_overhead):
    """The probes' extra time stays near 1% of the decoding (PROBE_BUDGET), and a loser is
    probed at most once in 64 calls (MAX_PROBE_INTERVAL) however large its loss: over 300 calls."""
    calls = 300
    ways = _run(CallRouter(), calls, speculative_cost=1.0 + loss, generate_cost=1.0)
    probes = sum(ways)  # the first is the loop's measurement
    assert 1 <= probes <= most_probes
    assert probes * loss / calls <= most_overhead


def test_keeps_speculating_when_it_is_cheaper():
    ways = _run(CallRouter(), 100, speculative_cost=0.5, generate_cost=1.0)
    assert not any(ways[:FIRST_PROBE_INTERVAL]) and all(ways[FIRST_PROBE_INTERVAL : FIRST_PROBE_INTERVAL + 10])
    assert sum(not way for way in ways) <= FIRST_PROBE_INTERVAL + 3


def test_switches_when_the_costs_change():
    router = CallRouter()
    _run(router, 50, speculative_cost=0.5, generate_cost=1.0)
    later = _run(router, 200, speculative_cost=3.0, generate_cost=1.0)
    assert not any(later[-100:-1]) or sum(later[-100:]) <= 3


def test_a_call_weighs_as_many_tokens_as_it_produced():
    """Every call has a fixed part (the first step reads the whole encoder output), so a short
    call costs more per token on either way. Seen live on the test clips: one 5-token call at
    16 ms per token lifted generate()'s running cost above a loop 25% slower, which then took
    four long windows in a row. A running cost is running seconds over running tokens."""
    router = CallRouter()
    router.record(False, 1, 0.80, 100)  # 8 ms per token
    router.record(False, 1, 0.08, 5)  # 16 ms per token, 5 tokens
    assert router.generate_cost[1] == pytest.approx((0.7 * 0.80 + 0.3 * 0.08) / (0.7 * 100 + 0.3 * 5))
    assert router.generate_cost[1] < 0.0083
    router.record(True, 1, 1.0, 100)  # the loop at 10 ms per token stays the loser
    assert router.use_loop(1) is False


def test_without_adaptive_every_call_speculates(model_path, clips):
    """adaptive=False: a router that would send every call to generate() is not asked."""
    flash = FlashWhisperModel(
        model_path,
        stock_engine=False,
        compute_type="float32",
        cpu_threads=THREADS,
        call_router=ForcedGenerate(),
        adaptive=False,
    )
    segments_of(flash, clips["clip00_kal16.ogg"], beam_size=1)
    assert flash.spec_stats.rows_in_generate == 0 and flash.spec_stats.rows_in_loop > 0


def test_the_adaptive_parts_turn_on_alone(model_path, clips):
    """Adaptive(route_calls=False): the router is not asked, every call speculates; with only
    route_calls on, it is asked (and sends every call to generate() here)."""
    from ct2_flash import Adaptive

    for adaptive, speculated in [
        (Adaptive(route_calls=False), True),
        (Adaptive(route_calls=True, pause_drafting=False, draft_lengths=False), False),
    ]:
        flash = FlashWhisperModel(
            model_path,
            stock_engine=False,
            compute_type="float32",
            cpu_threads=THREADS,
            call_router=ForcedGenerate(),
            adaptive=adaptive,
        )
        segments_of(flash, clips["clip00_kal16.ogg"], beam_size=1)
        assert (flash.spec_stats.rows_in_loop > 0) is speculated
        assert (flash.spec_stats.rows_in_generate == 0) is speculated
    with pytest.raises(TypeError, match="adaptive must be True, False or a ct2_flash.Adaptive"):
        Adaptive.of("yes")


def test_batches_are_compared_with_generate_at_their_own_size():
    router = CallRouter()
    _run(router, 10, speculative_cost=0.5, generate_cost=1.0)
    assert router.use_loop(8) is False  # no generate() measurement at batch 8 yet


@pytest.mark.parametrize("router", [ForcedGenerate, ForcedSpeculation])
def test_either_way_gives_faster_whisper_output(float32_pair, model_path, clips, router):
    """A never-agreeing drafter with calls sent to generate() or to the loop: same segments."""
    from ct2_flash.drafting.reference import RandomDrafter

    pair = float32_pair
    flash = FlashWhisperModel(
        model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS, call_router=router()
    )
    with flash.use_drafter(RandomDrafter(vocab_size=51864, seed=3), adaptive=True):
        name = "clip06_awb.ogg"
        got = segments_of(flash, clips[name], beam_size=1, without_timestamps=True)
        assert got == pair.reference(name, clips[name], beam_size=1, without_timestamps=True)
        stats = flash.spec_stats
        if router is ForcedGenerate:
            assert stats.rows_in_generate > 0 and stats.rows_in_loop == 0 and stats.draft_rounds == 0
            # Their time is counted apart from the loop's, which spent none.
            assert stats.generate_seconds > 0 and stats.decode_seconds == 0
        else:
            assert stats.rows_in_generate == 0 and stats.draft_rounds > 0
            assert stats.generate_seconds == 0 and stats.other_seconds > 0


def test_generate_way_is_token_identical_at_int8_too(pair, model_path, clips):
    """generate() is faster-whisper's own call, so even int8 matches exactly."""
    flash = FlashWhisperModel(
        model_path,
        stock_engine=False,
        compute_type=pair.compute_type,
        cpu_threads=THREADS,
        call_router=ForcedGenerate(),
    )
    for name in ("clip02_awb.ogg", "clip11_rms.ogg"):
        assert segments_of(flash, clips[name], beam_size=1) == pair.reference(name, clips[name], beam_size=1)


@pytest.mark.parametrize(
    "confidences, slope, chosen",
    [
        ([0.99] * 8, 0.05, 8),  # nearly always right, rows nearly free: verify all of them
        ([0.99, 0.99, 0.99] + [0.02] * 5, 0.1, 3),  # right for three, then wrong: stop there
        ([0.02] * 8, 0.5, 0),  # nearly always wrong: a plain step
        ([0.99] * 8, 3.0, 0),  # right, but each row costs three steps: a plain step
        ([0.9, 0.9], 0.1, 2),  # only two proposed: both
        ([], 0.1, 0),
    ],
)
def test_draft_length_picks_the_count_a_cost_curve_makes_best(confidences, slope, chosen):
    """On a synthetic cost curve (a 5 ms step, each verified row ``slope`` of a step more) and a
    drafter calibrated by what it got right, the chosen count is the one that is obviously
    best, with its neighbours at least 5% fewer tokens per second."""
    router = DraftLengths()
    rng = np.random.default_rng(0)
    cost = lambda n: 0.005 * (1 + slope * n)  # noqa: E731 seconds
    # Verifications of every length, each accepting as the calibration says (q = p here).
    for _ in range(400):
        n = int(rng.integers(0, 9))
        probs = rng.uniform(0.01, 1.0, size=n)
        accepted = 0
        while accepted < n and rng.random() < probs[accepted]:
            accepted += 1
        router.observe(n, accepted, accepted < n, cost(n), np.log(probs))
    fitted_slope, intercept = router.verification.fit()
    assert fitted_slope / intercept == pytest.approx(slope, rel=1e-6)
    assert router.choose(np.log(confidences) if confidences else []) == chosen


def test_calibration_learns_an_overconfident_drafter():
    router = DraftLengths()
    for _ in range(200):  # says 0.95, is right a fifth of the time
        accepted = int(np.random.default_rng(_).random() < 0.2)
        router.observe(1, accepted, accepted < 1, 0.005, [math.log(0.95)])
    assert router.acceptance([math.log(0.95)])[0] < 0.3
    assert router.choose([math.log(0.95)] * 8) <= 1


def test_rows_asks_for_every_draft_until_both_costs_are_timed():
    router = DraftLengths()
    assert router.rows(8) == 8 and router.rows(1) == 1
    router.observe(0, 0, False, 0.005)
    assert router.rows(8) == 8  # the proposal's cost is still unknown
    router.observe_proposal(8, 0.003)
    assert 1 <= router.rows(8) <= 8


@pytest.mark.parametrize(
    "acceptance, propose_slope, rows_of_8, rows_of_3",
    [
        ([0.9] * 8, 0.14, 8, 3),  # right nine times in ten: the longest drafts pay (7, plus one to explore)
        ([0.9, 0.9, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2], 0.14, 3, 3),  # right for two, then rarely: 2 + 1
        ([0.98] * 8, 0.5, 8, 3),  # costly rows, but nearly always right
    ],
)
def test_rows_follow_the_acceptance_seen_at_each_position_and_explore_one_more(
    acceptance, propose_slope, rows_of_8, rows_of_3
):
    """Before a proposal, k is the row count with the most expected tokens per second of
    verification plus proposal (by the acceptance observed at each position), plus one."""
    router = DraftLengths()
    rng = np.random.default_rng(1)
    verify = lambda n: 0.005 * (1 + 0.07 * n)  # noqa: E731
    propose = lambda k: 0.0011 * (1 + propose_slope * k)  # noqa: E731
    for _ in range(2000):
        n = int(rng.integers(1, 9))
        accepted = 0
        while accepted < n and rng.random() < acceptance[accepted]:
            accepted += 1
        router.observe(n, accepted, accepted < n, verify(n))
        router.observe_proposal(n, propose(n))
    learned = router.acceptance_by_position(8)
    # A memory of ~50 rounds, pulled a little towards the prior of 0.5.
    np.testing.assert_allclose(learned[:2], acceptance[:2], atol=0.15)
    assert router.rows(8) == rows_of_8 and router.rows(3) == rows_of_3


@pytest.mark.parametrize(
    "acceptance, slope, chosen",
    [
        (0.97, 0.05, range(24, 33)),  # nearly always right, cheap rows: E(n)/cost(n) is best at 28-30
        (0.5, 0.1, range(2, 4)),  # right half the time: E(n) = 1 + q + q^2 ... levels off at 2; best at 2
        (0.0, 0.1, range(0, 1)),  # never right: a plain step
    ],
)
def test_offered_tokens_are_verified_as_far_as_their_own_acceptance_pays(acceptance, slope, chosen):
    """Offered tokens are counted apart from the drafter's: their rounds teach the offered
    acceptance and the verification cost, not the acceptance by position the drafter's
    length uses."""
    router = DraftLengths()
    rng = np.random.default_rng(2)
    cost = lambda n: 0.005 * (1 + slope * n)  # noqa: E731 seconds
    for _ in range(300):
        n = int(rng.integers(1, 33))
        accepted = 0
        while accepted < n and rng.random() < acceptance:
            accepted += 1
        router.observe_offered(n, accepted, accepted < n, cost(n))
    assert router.offered(32) in chosen
    assert router.offered(0) == 0
    assert not router._judged_at.size  # the drafter's acceptance by position saw none of it


def test_re_decodes_are_routed_by_the_length_of_their_previous_hypothesis():
    """``RedecodeRouters``: one router per doubling of the previous hypothesis's length (one
    under 8 tokens, one from 64 up); each measures the loop first, then generate(), and then
    sends calls the cheaper way, probing the loser within CallRouter's budget."""
    routers = RedecodeRouters()
    assert [routers.bucket(n) for n in (0, 7, 8, 15, 16, 31, 32, 63, 64, 500)] == [0, 0, 8, 8, 16, 16, 32, 32, 64, 64]
    assert routers.router(20) is routers.router(31) and routers.router(20) is not routers.router(32)
    short, long = routers.router(4), routers.router(80)
    ways = {id(short): [], id(long): []}
    for _ in range(40):
        for router, loop_seconds in ((short, 0.030), (long, 0.005)):  # the loop loses on short ones only
            speculative = router.use_loop(1)
            ways[id(router)].append(speculative)
            router.record(speculative, 1, loop_seconds if speculative else 0.010, 1)
    for router in (short, long):
        assert ways[id(router)][:3] == [True, True, False]  # two in the loop, then generate() is measured
    assert sum(ways[id(short)][3:]) <= 3  # the loser, probed now and then
    assert sum(ways[id(long)][3:]) >= 34


@pytest.mark.parametrize(
    "options, prompts, reason",
    [
        (dict(beam_size=5), [[50257]], "beam search"),
        (dict(), [[50257]], "beam search"),  # CTranslate2's default beam_size is 5
        (dict(beam_size=1, num_hypotheses=2), [[50257]], "several hypotheses"),
        (dict(beam_size=1, repetition_penalty=1.1), [[50257]], "repetition_penalty"),
        (dict(beam_size=1, some_future_option=True), [[50257]], "some_future_option"),
        (dict(beam_size=1), [["<|startoftranscript|>"]], "token strings"),
    ],
)
def test_a_call_the_loop_cannot_run_is_routed_with_its_reason(options, prompts, reason):
    from ct2_flash.adapter.routing import CallRoutes

    route = CallRoutes().route(prompts, options, None, recall=lambda: None, ask_router=True, seeded=False)
    assert reason in route.ineligible and not route.loop and route.router is None and route.options is None


def test_a_route_says_which_router_decides_and_whether_the_loop_runs():
    from ct2_flash.adapter.routing import CallRoutes, inexact_reason

    routes = CallRoutes(ForcedGenerate())
    greedy = routes.route([[50257]], dict(beam_size=1), None, recall=lambda: None, ask_router=True, seeded=False)
    assert greedy.ineligible is None and greedy.router is routes.greedy and not greedy.loop and greedy.previous is None
    redecode = routes.route([[50257]], dict(beam_size=1), None, recall=lambda: [1, 2, 3], ask_router=True, seeded=False)
    assert redecode.previous == (1, 2, 3) and redecode.router is routes.redecodes.router(3) and redecode.loop
    sampled = dict(beam_size=1, sampling_topk=0, sampling_temperature=0.6)
    asked = []
    drawn = routes.route([[50257]], sampled, None, recall=lambda: asked.append(1), ask_router=True, seeded=True)
    assert drawn.router is routes.sampling[(0.6, 0)] and drawn.loop and drawn.wait and not asked  # no recall
    unasked = routes.route([[50257]], dict(beam_size=1), None, recall=lambda: None, ask_router=False, seeded=False)
    assert unasked.loop  # adaptive off: every eligible call drafts
    standing = inexact_reason("int8", False)
    assert routes.route([[50257]], dict(beam_size=1), standing, lambda: None, True, False).ineligible == standing
    with pytest.raises(ValueError, match="sampling_temperature"):
        routes.route(
            [[50257]], dict(beam_size=1, sampling_topk=0, sampling_temperature=-1.0), None, lambda: None, True, False
        )


def test_a_route_is_made_once_per_call(model_path, clips, monkeypatch):
    """Every generate() call, whichever way it goes (the loop, generate(), beam search, a
    re-decode), is routed exactly once."""
    from ct2_flash.adapter.speculative_whisper import SpeculativeWhisper

    counts = {"generate": 0, "route": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(SpeculativeWhisper, "generate", counted("generate", SpeculativeWhisper.generate))
    monkeypatch.setattr(SpeculativeWhisper, "route", counted("route", SpeculativeWhisper.route))
    flash = FlashWhisperModel(model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS)
    audio = clips["clip06_awb.ogg"]
    for options in (dict(beam_size=1), dict(beam_size=1), dict(beam_size=5), dict(beam_size=1, word_timestamps=True)):
        segments_of(flash, audio, **options)
    assert flash.spec_stats.redecodes >= 1 and flash.spec_stats.unchanged_calls >= 1
    assert counts["route"] == counts["generate"] >= 4


def test_the_former_router_keywords_still_work_and_warn(model_path):
    from ct2_flash.adapter.routing import EngineRouter

    call_router, engine_router = ForcedGenerate(), EngineRouter()
    with pytest.warns(DeprecationWarning, match="call_router"):
        flash = FlashWhisperModel(
            model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS, policy=call_router
        )
    assert flash.model.call_router is call_router
    with pytest.warns(DeprecationWarning, match="engine_router"):
        flash = FlashWhisperModel(
            model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS, engine_policy=engine_router
        )
    assert flash.model.engines.engine_router is engine_router
    with pytest.raises(TypeError, match="call_router= only"):
        FlashWhisperModel(
            model_path, stock_engine=False, compute_type="float32", policy=call_router, call_router=ForcedGenerate()
        )


def test_each_call_is_served_one_way_and_booked_once(model_path, clips):
    """``_serve`` says how each call went (``Served``: its way and its seconds) and ``_book``
    counts it once: its rows where they ran, and generate()'s seconds only for generate()'s part."""
    for router, ways in ((ForcedGenerate, {GENERATE, CONTINUED}), (ForcedSpeculation, {LOOP})):
        flash = FlashWhisperModel(
            model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS, call_router=router()
        )
        served = []
        serve = flash.model._serve

        def keeping(*args, serve=serve, served=served, **kwargs):
            result, how = serve(*args, **kwargs)
            served.append(how)
            return result, how

        flash.model._serve = keeping
        segments_of(flash, clips["clip06_awb.ogg"], beam_size=1)
        stats = flash.spec_stats
        assert served and {how.way for how in served} <= ways, served
        assert stats.rows_in_loop + stats.rows_in_generate == len(served)  # one row a call
        assert stats.generate_seconds == pytest.approx(sum(how.generate_seconds for how in served))
        assert all(how.seconds == how.generate_seconds + how.loop_seconds > 0 for how in served)

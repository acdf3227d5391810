"""The ObjectServer's request-rate cap (503 + Retry-After) and its latency schedule."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest

from aioload.testing.object_server import LOOPBACK_OPENER, ObjectServer

pytestmark = pytest.mark.timeout(60)


def _get(url: str) -> tuple[int, dict[str, str]]:
    try:
        with LOOPBACK_OPENER.open(url, timeout=10) as answer:
            answer.read()
            return answer.status, dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    return tmp_path


def test_requests_beyond_the_rate_limit_are_answered_503_with_retry_after(folder: Path) -> None:
    # One request a second, a burst of one: of many requests in a row, few pass.
    with ObjectServer(folder, rate_limit=1) as server:
        answers = [_get(server.url + "/a.bin") for _ in range(10)]
        stats = server.stats()
    statuses = [status for status, _ in answers]
    assert statuses[0] == 200
    assert statuses.count(503) >= 7
    throttled = next(headers for status, headers in answers if status == 503)
    assert int(throttled["Retry-After"]) >= 1
    assert int(throttled["Retry-After-Ms"]) >= 1
    assert stats["throttled"] == statuses.count(503)
    assert stats["requests"] == 10


def test_the_rate_limit_changes_while_running_and_429_may_answer(folder: Path) -> None:
    with ObjectServer(folder, throttle_status=429) as server:
        assert [_get(server.url + "/a.bin")[0] for _ in range(5)] == [200] * 5
        server.limit_rate(1)
        statuses = [_get(server.url + "/a.bin")[0] for _ in range(5)]
        assert 429 in statuses
        server.limit_rate(None)
        assert [_get(server.url + "/a.bin")[0] for _ in range(5)] == [200] * 5


def test_a_latency_step_replaces_the_latency(folder: Path) -> None:
    # 30 s of latency would outlast the client's timeout: the step at 0 s removes it.
    with ObjectServer(folder, latency=30.0, latency_steps=[(0.0, 0.0)]) as server:
        assert _get(server.url + "/a.bin")[0] == 200
        server.schedule_latency([(0.0, 0.0), (3600.0, 30.0)])
        assert _get(server.url + "/a.bin")[0] == 200


@pytest.mark.parametrize(
    "options",
    [
        {"rate_limit": 0},
        {"rate_limit": True},
        {"throttle_status": 200},
        {"latency_steps": [(-1, 0)]},
    ],
)
def test_bad_throttle_options_are_refused(folder: Path, options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ObjectServer(folder, **options)  # type: ignore[arg-type]

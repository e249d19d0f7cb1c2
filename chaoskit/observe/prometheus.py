"""The site's own monitoring on the timeline: Prometheus queries as stop conditions and as probes.

Both ask a Prometheus server's HTTP API (``GET URL/api/v1/query``) an instant
query every :data:`POLL_S` and want one number back: a scalar, or a vector of
exactly one sample (aggregate a query over many series yourself: ``max(...)``).

- :class:`StopWatcher` (``safety.stop_when``): a condition holds while the value
  is above (or below) its threshold; once it has held for its ``for`` it *fires*:
  a ``safety.stop`` event on the timeline, and :attr:`StopWatcher.fired` says
  which and with what value, so the runner aborts (reverting everything, exit 4).
  A query that cannot be answered mid-drill does not fire; it is noted.
- :class:`PrometheusProbe` (``probes.prometheus``): a rule's value that rises
  (``when: rises``: above its previous value) or crosses its ``above`` threshold
  becomes an event of the rule's kind (``detect`` by default, a detection source
  like torchrun's), stamped with the time of the query that saw it. Only the
  change is an event: a value that keeps rising, or stays above, is one event
  until it stops doing so.

stdlib only (``urllib``): querying needs no client library.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Sequence

from chaoskit.observe.events import EventBus, make_event

__all__ = ["POLL_S", "QueryError", "query_value", "StopWatcher", "PrometheusProbe", "describe_condition"]

POLL_S = 1.0
"""Seconds between two evaluations of a stop condition or a probe rule (a detection's time is at most this late,
plus Prometheus's own scrape interval)."""

_MAX_BODY = 1 << 20
_TIMEOUT_S = 5.0


class QueryError(Exception):
    """A query that gave no number: the server unreachable or refusing it, an empty result, several series."""


def query_value(url: str, query: str, timeout: float = _TIMEOUT_S) -> float:
    """The one number ``query`` evaluates to now on the Prometheus at ``url``; :class:`QueryError` saying why not."""
    endpoint = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(endpoint, timeout=timeout) as resp:  # noqa: S310 - http(s) only: checked in the model
            body = resp.read(_MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        detail = _error_text(exc.read(_MAX_BODY))
        raise QueryError(f"{url} answered HTTP {exc.code}" + (f": {detail}" if detail else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        raise QueryError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
    if len(body) > _MAX_BODY:
        raise QueryError(f"{url} answered more than {_MAX_BODY} bytes")
    try:
        doc = json.loads(body)
        data = doc["data"]
        kind, result = data["resultType"], data["result"]
    except (ValueError, KeyError, TypeError):
        raise QueryError(f"{url} did not answer like a Prometheus query API (GET /api/v1/query)") from None
    if kind == "scalar":
        raw = result[1]
    elif kind == "vector":
        if not result:
            raise QueryError("the query returned no sample (an empty vector: no such series now)")
        if len(result) > 1:
            raise QueryError(f"the query returned {len(result)} series; aggregate it to one, e.g. max(...)")
        raw = result[0]["value"][1]
    else:
        raise QueryError(f"the query returned a {kind}, not a number")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise QueryError(f"the query returned {raw!r}, not a number") from None
    if math.isnan(value):
        raise QueryError("the query returned NaN")
    return value


def describe_condition(cond: Any) -> str:
    """``max(x) above 0.5 for 30s at http://...`` for a ``safety.stop_when`` entry."""
    side, threshold = ("above", cond.above) if cond.above is not None else ("below", cond.below)
    return f"{cond.query} {side} {threshold:g}" + (f" for {cond.for_:g}s" if cond.for_ else "") + f" (Prometheus {cond.prometheus})"


class _Poller(threading.Thread):
    def __init__(self, name: str, poll_s: float) -> None:
        super().__init__(daemon=True, name=name)
        self.poll_s = poll_s
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            started = time.monotonic()
            self.evaluate()
            self.stop_event.wait(max(0.0, self.poll_s - (time.monotonic() - started)))

    def evaluate(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout=_TIMEOUT_S + 1)


class StopWatcher(_Poller):
    """Evaluates ``safety.stop_when`` conditions (objects with ``prometheus``, ``query``, ``above``/``below``,
    ``for_`` in seconds) until stopped; :attr:`fired` is ``None`` until one fired, then what the runner says."""

    def __init__(self, bus: EventBus, conditions: Sequence[Any], poll_s: float = POLL_S) -> None:
        super().__init__("chaoskit-stop-when", poll_s)
        self.bus, self.conditions = bus, list(conditions)
        self.since: list[float | None] = [None] * len(self.conditions)
        self.fired: dict[str, Any] | None = None
        self.failures: dict[int, tuple[int, str]] = {}

    def preflight(self) -> tuple[list[str], list[str]]:
        """Ask every condition once, before anything is injected: (the conditions whose query gives no number,
        why; the conditions that already hold, with their value)."""
        unanswered, holding = [], []
        for i, cond in enumerate(self.conditions):
            try:
                value = query_value(cond.prometheus, cond.query)
            except QueryError as exc:
                unanswered.append(f"safety.stop_when.{i} ({cond.query}): {exc}")
                continue
            if _breached(cond, value):
                holding.append(f"safety.stop_when.{i} already holds before anything was injected: "
                               f"{describe_condition(cond)}; value {value:g}")
        return unanswered, holding

    def evaluate(self) -> None:
        if self.fired is not None:
            return
        for i, cond in enumerate(self.conditions):
            t = time.time()
            try:
                value = query_value(cond.prometheus, cond.query)
            except QueryError as exc:
                count = self.failures.get(i, (0, ""))[0] + 1
                self.failures[i] = (count, str(exc))
                continue  # no number is no breach (and is said in the notes)
            if not _breached(cond, value):
                self.since[i] = None
                continue
            if self.since[i] is None:
                self.since[i] = t
            if t - self.since[i] >= cond.for_:
                self._fire(i, cond, value, t)
                return

    def _fire(self, index: int, cond: Any, value: float, ts: float) -> None:
        side, threshold = ("above", cond.above) if cond.above is not None else ("below", cond.below)
        message = f"safety.stop_when.{index} fired: {describe_condition(cond)}; value {value:g}"
        self.bus.publish(make_event("safety.stop", ts, node=_host(cond.prometheus), source="prometheus", who="stop condition",
                                    condition=index, query=cond.query, value=value, **{side: threshold},
                                    for_s=cond.for_, since=self.since[index], why=message))
        self.fired = {"condition": index, "query": cond.query, "prometheus": cond.prometheus, side: threshold,
                      "for_s": cond.for_, "value": value, "ts": ts, "message": message}

    def notes(self) -> list[str]:
        return [f"safety.stop_when.{i} could not be evaluated {n} time(s) during the drill; last: {why}"
                for i, (n, why) in sorted(self.failures.items())]


class PrometheusProbe(_Poller):
    """Turns ``probes.prometheus`` rules (objects with ``url``, ``query``, ``event``, ``when``, ``above``) into
    timeline events when their value rises or crosses its threshold."""

    def __init__(self, bus: EventBus, rules: Sequence[Any], poll_s: float = POLL_S) -> None:
        super().__init__("chaoskit-prometheus", poll_s)
        self.bus, self.rules = bus, list(rules)
        self.last: list[float | None] = [None] * len(self.rules)
        self.active = [False] * len(self.rules)
        self.errors: dict[int, str] = {}

    def evaluate(self) -> None:
        for i, rule in enumerate(self.rules):
            sent = time.time()
            try:
                value = query_value(rule.url, rule.query)
            except QueryError as exc:
                self.errors[i] = str(exc)
                continue
            ts = (sent + time.time()) / 2  # the server evaluated it between sending and the answer
            before, self.last[i] = self.last[i], value
            if rule.above is not None:
                now = value > rule.above
                why = f"{rule.query} = {value:g}, above {rule.above:g}"
            else:
                now = before is not None and value > before
                why = f"{rule.query} rose from {before:g} to {value:g}" if before is not None else ""
            if now and not self.active[i]:
                self.bus.publish(make_event(rule.event, ts, node=_host(rule.url), source="prometheus", who="prometheus",
                                            rule=i, query=rule.query, value=value, previous=before, why=why))
            self.active[i] = now

    def notes(self) -> list[str]:
        return [f"probes.prometheus.{i} ({self.rules[i].query}): {why}" for i, why in sorted(self.errors.items())]


def _breached(cond: Any, value: float) -> bool:
    return value > cond.above if cond.above is not None else value < cond.below


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))[:200]
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace").strip()

"""Each API key's budget use this minute, for `/metrics`: what a tenant used and may use.

It is read from Redis at each scrape. The counters are those ADMIT, SETTLE and SPEND keep on
the queues server. So every replica serves the same figures (take `max`). A key appears by
its key id (api/http/auth.py `key_id`), never the key. The first METRICS_KEYS keys
configured have series of their own. The rest are summed under `key="other"`, so a pool of
many keys keeps a bounded number of series. The refusals by key are the API process's own
(`tokenspool_key_requests_rejected`, api/metrics.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

from api.http.auth import OTHER
from api.jobs.owners import this_minute
from contract import keys

if TYPE_CHECKING:
    from api.services import Services

# the budget label -> its counter's key
BUDGETS = {
    "requests": keys.requests_per_minute,
    "bytes": keys.bytes_per_minute,
    "tokens": keys.tokens_per_minute,
}


async def budget_use(services: Services) -> list[Metric]:
    used = GaugeMetricFamily(
        "tokenspool_key_budget_used",
        "What a key was charged this minute (requests, bytes, tokens), by key id.",
        labels=["key", "budget"],
    )
    limit = GaugeMetricFamily(
        "tokenspool_key_budget_limit",
        "A key's budget a minute (0: none), by key id.",
        labels=["key", "budget"],
    )
    owners = services.keys.owners()
    if owners:
        minute = this_minute()
        async with services.redis.pipeline(transaction=False) as pipe:
            for owner, _ in owners:
                for counter in BUDGETS.values():
                    pipe.get(counter(owner, minute))
            raw = await pipe.execute()
        shown = services.settings.access.metrics_keys
        other = dict.fromkeys(BUDGETS, 0)
        for n, (owner, grant) in enumerate(owners):
            label = services.keys.label(owner, shown)
            figures = [int(v or 0) for v in raw[n * len(BUDGETS) : (n + 1) * len(BUDGETS)]]
            if label == OTHER:
                for budget, figure in zip(BUDGETS, figures, strict=True):
                    other[budget] += figure
                continue
            budgets = services.admission.budgets(grant)
            for budget, figure in zip(BUDGETS, figures, strict=True):
                used.add_metric([label, budget], figure)
                limit.add_metric([label, budget], getattr(budgets, f"{budget}_per_minute"))
        if len(owners) > shown:
            for budget, figure in other.items():
                used.add_metric([OTHER, budget], figure)
    return [used, limit]

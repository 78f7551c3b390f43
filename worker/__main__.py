"""`python -m worker`: load the model once, announce it, and take its jobs until stopped."""

from __future__ import annotations

import logging

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from contract import keys
from worker.engine import LlamaEngine
from worker.jobs import JobRunner, install
from worker.presence import Presence
from worker.publisher import Publisher
from worker.rqworker import AllowlistedJob, TokenspoolWorker
from worker.settings import WorkerSettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    log = logging.getLogger("tokenspool.worker")
    settings = WorkerSettings.from_env()
    log.info("loading %s from %s", settings.model_name, settings.model_path)
    engine = LlamaEngine(settings)
    client = redis.Redis.from_url(settings.redis_url)
    install(
        JobRunner(
            engine,
            Publisher(client, settings.name, settings.retention_s),
            client,
            settings.retention_s,
        )
    )
    presence = Presence(
        redis.Redis.from_url(settings.redis_url), settings.model_name, settings.name, settings.announce_s
    )
    queue = Queue(keys.queue_name(settings.model_name), connection=client, serializer=JSONSerializer)
    worker = TokenspoolWorker(
        [queue],
        name=settings.name,
        connection=client,
        serializer=JSONSerializer,
        job_class=AllowlistedJob,
    )
    presence.start()
    log.info("worker %s serving %s (n_ctx %d)", settings.name, settings.model_name, engine.n_ctx)
    try:
        worker.work(logging_level="INFO")
    finally:
        presence.stop()


if __name__ == "__main__":
    main()

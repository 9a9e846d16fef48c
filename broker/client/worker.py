"""A handler per message (`kq worker MODULE:FUNCTION`, SPEC section 7).

The handler is a plain or `async def` function taking a `Message`. Returning acks the
message; raising cancels it (the queue's `redelivery_delay` applies), and the error is
logged. A handler that answered the message itself (ack, cancel, expire) is left as it
answered. `concurrency` handlers run at once, in threads (an `async def` one in an event loop
of its thread); the subscription leases as many messages as run at once.

`stop()` (the CLI calls it on SIGTERM or Ctrl-C) takes nothing new, lets the running handlers
finish within `grace` seconds, then closes the client: leases not answered return to the
queue at once, not after the service's heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from broker.client.message import Message
from broker.client.sync import QueueClient
from broker.errors import ConfigError

log = logging.getLogger("kq.worker")

POLL_S = 0.2  # how often the reading loop looks whether it was told to stop

Handler = Callable[[Message], Any]


def load_handler(spec: str) -> Handler:
    """`package.module:function` (the module found from the current directory too);
    ConfigError naming what is missing."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"handler {spec!r}: use MODULE:FUNCTION, e.g. jobs:handle")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handler {spec!r}: cannot import {module_name!r}: {exc}") from None
    except SyntaxError as exc:
        raise ConfigError(f"handler {spec!r}: {exc.filename}, line {exc.lineno}: "
                          f"{exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while imported
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise ConfigError(f"handler {spec!r}: importing {module_name} raised {exc!r} "
                          f"({where.filename}, line {where.lineno})") from None
    if not hasattr(module, attr):
        raise ConfigError(f"handler {spec!r}: {module_name} has no function {attr!r}")
    handler = getattr(module, attr)
    if not callable(handler):
        raise ConfigError(f"handler {spec!r}: {module_name}.{attr} is not a function")
    return handler  # type: ignore[no-any-return]


class Worker:
    def __init__(self, client: QueueClient, queue: str, handler: Handler, concurrency: int = 1,
                 filter: str | None = None, max_backlog: int | None = None,
                 grace: float = 30.0) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be 1 or more, not {concurrency}")
        self.client, self.queue, self.handler = client, queue, handler
        self.concurrency, self.filter, self.grace = concurrency, filter, grace
        self.max_backlog = concurrency if max_backlog is None else max_backlog
        self.is_async = inspect.iscoroutinefunction(handler)
        self.handled = self.failed = 0
        self.subscribed = False  # (until the service answers the subscribe)
        self.unfinished = 0  # handlers still running when the grace ran out
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(concurrency)
        self._loops = threading.local()
        self._count_lock = threading.Lock()

    def stop(self) -> None:
        """Take nothing new; `run` then waits for the running handlers, within the grace."""
        self._stop.set()

    def run(self) -> None:
        """Handle messages until stopped; then close the subscription and the client (also
        when the subscribe fails or is interrupted)."""
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="kq-handler")
        running: set[Future[None]] = set()
        try:
            sub = self.client.subscribe(self.queue, filter=self.filter,
                                        max_backlog=self.max_backlog)
            self.subscribed = True
            log.info("worker %s: handling %s with %s, %d at once", self.client.name, self.queue,
                     getattr(self.handler, "__qualname__", self.handler), self.concurrency)
            while not self._stop.is_set():
                if not self._slots.acquire(timeout=POLL_S):
                    continue
                msg = next(iter(sub.messages(timeout=POLL_S)), None)
                if msg is None:
                    self._slots.release()
                    continue
                future = pool.submit(self._handle, msg)
                running.add(future)
                future.add_done_callback(running.discard)
            deadline = time.monotonic() + self.grace
            if running:
                log.info("worker %s: stopping: waiting up to %.0f s for %d running handler(s)",
                         self.client.name, self.grace, len(running))
            while running and time.monotonic() < deadline:
                time.sleep(0.05)
            self.unfinished = len(running)
            if self.unfinished:
                log.warning("worker %s: %d handler(s) still running after the grace of %.0f s:"
                            " their messages go back to the queue", self.client.name,
                            self.unfinished, self.grace)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self.client.close()  # leases not answered return to the queue at once

    def _handle(self, msg: Message) -> None:
        try:
            if self.is_async:
                self._loop().run_until_complete(self.handler(msg))
            else:
                self.handler(msg)
        # (BaseException: a handler's KeyboardInterrupt or SystemExit is a failed job too,
        # raised in a pool thread where nothing else would see it)
        except BaseException:  # noqa: BLE001 - a failing job is the handler's, not the worker's
            log.exception("handler failed on %s (delivery %d): cancelled", msg.bookmark,
                          msg.delivery_count)
            with self._count_lock:
                self.failed += 1
            if not msg.answered:
                msg.cancel()
        else:
            with self._count_lock:
                self.handled += 1
            if not msg.answered:
                msg.ack()
        finally:
            self._slots.release()

    def _loop(self) -> asyncio.AbstractEventLoop:
        """This handler thread's event loop (async handlers)."""
        loop = getattr(self._loops, "loop", None)
        if loop is None:
            loop = self._loops.loop = asyncio.new_event_loop()
        return loop

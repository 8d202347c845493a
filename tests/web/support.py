"""Dashboard test support: the app on a real uvicorn server in a thread (a private port), logged-in clients."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from pgjobs.web.app import create_app
from pgjobs.web.config import WebConfig

TOKEN = "test-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningWeb:
    url: str
    config: WebConfig
    app: Any
    server: uvicorn.Server

    def client(self, login: bool = True, **kwargs: Any) -> httpx.Client:
        c = httpx.Client(base_url=self.url, timeout=15, **kwargs)
        if login:
            r = c.post("/login", data={"token": TOKEN, "next": "/"}, headers={"Origin": self.url})
            assert r.status_code == 303, r.text
        return c

    def csrf(self) -> str:
        return self.config.csrf_token


def start_web(config: WebConfig) -> RunningWeb:
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the dashboard server did not start")
        time.sleep(0.02)
    web = RunningWeb(f"http://{config.host}:{config.port}", config, app, server)
    web._thread = thread  # type: ignore[attr-defined]
    return web


def stop_web(web: RunningWeb) -> None:
    web.app.state.hub.end_streams()
    time.sleep(0.05)
    web.server.should_exit = True
    web._thread.join(timeout=15)  # type: ignore[attr-defined]

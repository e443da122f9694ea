"""The real `serve` HTTP server for tests (tests/fdpp_rewrite/serve/): a module of its own, not conftest.py,
so a test can import it by name without meeting another folder's conftest."""

import time


def wait_for(condition, seconds=10.0) -> bool:
    """Poll condition() until it is true (True) or seconds have passed (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


class RunningServer:
    """The real uvicorn server of `serve` on a free loopback port, in a background thread of the test process."""

    def __init__(self, engine_dir, limits=None, **options):
        """limits: a fdpp_rewrite.serve.limits.Limits (default: serve's defaults); options: build_app's."""
        import threading

        from fdpp_rewrite.engine.runtime import Engine
        from fdpp_rewrite.serve.limits import Limits
        from fdpp_rewrite.serve.server import bind, build_app, make_server

        self.limits = limits or Limits()
        self.app, self.scheduler = build_app(Engine(engine_dir), model_name="tiny", limits=self.limits, **options)
        sock = bind("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(self.app, self.scheduler, self.limits)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                break
            self.thread.join(0.05)
        assert self.server.started, "the server did not start"

    def client(self, api_key="none", **options):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **options)

    def metrics(self) -> dict:
        import httpx

        from fdpp_rewrite.serve.metrics import parse

        return parse(httpx.get(f"{self.url}/metrics").text)

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)

"""
A small W3C WebDriver client for the web page tests: Debian's chromium, driven through
chromium-driver's HTTP API with ``requests`` (already installed with Airflow), so the tests
need no Selenium and nothing beyond the Debian packages that ``.ci/run`` installs.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time

import requests

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium_found() -> tuple[str | None, str | None]:
    return (shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver"))


class Browser:
    """One headless Chromium session."""

    def __init__(self) -> None:
        binary, driver = chromium_found()
        if not binary or not driver:
            raise RuntimeError(
                "Debian's chromium and chromium-driver are not installed (.ci/run installs them)"
            )
        self.port = free_port()
        self.driver = subprocess.Popen(
            [driver, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                requests.get(f"{self.base}/status", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        capabilities = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1400,2000",
                ],
            },
        }
        answer = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})
        self.session = answer["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None):
        response = requests.request(method, self.base + path, json=body, timeout=120)
        value = response.json().get("value")
        if response.status_code >= 400:
            raise RuntimeError(f"webdriver {method} {path}: {value}")
        return value

    def _session(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        self._session("POST", "/url", {"url": url})

    def source(self) -> str:
        return self._session("GET", "/source")

    def find(self, css: str) -> str:
        return self._session("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def find_all(self, css: str) -> list[str]:
        return [
            e[ELEMENT] for e in self._session("POST", "/elements", {"using": "css selector", "value": css})
        ]

    def type(self, css: str, text: str) -> None:
        self._session("POST", f"/element/{self.find(css)}/value", {"text": text})

    def click(self, css: str) -> None:
        self._session("POST", f"/element/{self.find(css)}/click", {})

    def attribute(self, element: str, name: str) -> str:
        return self._session("GET", f"/element/{element}/attribute/{name}")

    def element_text(self, element: str) -> str:
        return self._session("GET", f"/element/{element}/text")

    def shown_dag_ids(self) -> list[str]:
        """The DAG ids of the list page's rows, in order."""
        return [self.attribute(row, "data-dag-id") for row in self.find_all("tr.dag-row")]

    def text(self, css: str) -> str:
        return self._session("GET", f"/element/{self.find(css)}/text")

    def script(self, code: str):
        return self._session("POST", "/execute/sync", {"script": code, "args": []})

    def cookies(self) -> dict[str, str]:
        return {c["name"]: c["value"] for c in self._session("GET", "/cookie")}

    def screenshot(self, path) -> None:
        path.write_bytes(base64.b64decode(self._session("GET", "/screenshot")))

    def close(self) -> None:
        try:
            self._session("DELETE", "")
        finally:
            self.driver.terminate()
            self.driver.wait(10)

"""``nemo-fastdecode loadtest``: concurrent WebSocket clients against a server on this machine.

* :mod:`.client` -- one client: real-time paced audio, commit, the final; per-partial and final latency.
* :mod:`.report` -- points per client count, exactness against NeMo's streaming alone, Markdown, JSON, plot.
* :mod:`.app` -- inputs, references, clients over one or several processes, a sweep.
"""

from nemo_fastdecode.apps.loadtest.client import ClientResult, connect_session, receive_until, run_client
from nemo_fastdecode.apps.loadtest.report import LoadPoint, LoadtestResult

__all__ = ["ClientResult", "LoadPoint", "LoadtestResult", "connect_session", "receive_until", "run_client"]

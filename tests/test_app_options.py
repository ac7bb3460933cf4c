"""The apps' options for a newcomer: ``--help`` with each option's description, misspelled keys with a suggestion,
a load test without a server, NeMo's set-up lines one line each, every input of a manifest streamed (CPU, quick)."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time

import pytest

from fastdecode_lab.configs import StreamingConfig
from fastdecode_lab.streaming_sim.app import resolve_config as resolve_streaming
from fastdecode_lab.streaming_sim.app import stream_count
from nemo_fastdecode.apps.confighelp import attribute_docs, check_hydra_argv, format_options, unknown_keys
from nemo_fastdecode.apps.configs import LoadtestConfig, ParallelTranscribeConfig, TranscribeConfig
from nemo_fastdecode.apps.options import parse_config
from nemo_fastdecode.nemo.one_line_logs import OneLineOnce, one_line
from nemo_fastdecode.serve.config import ServeConfig


@pytest.mark.parametrize("schema", [ServeConfig, LoadtestConfig, TranscribeConfig, ParallelTranscribeConfig])
def test_every_option_has_a_description_from_the_docstring(schema):
    docs = attribute_docs(schema)
    assert {f.name for f in dataclasses.fields(schema)} <= set(docs), set(f.name for f in dataclasses.fields(schema))
    assert all(docs.values()) and "``" not in "".join(docs.values())


def test_cli_help_lists_options_with_descriptions_and_defaults(capsys):
    with pytest.raises(SystemExit) as done:
        parse_config(ServeConfig, ["--help"], "nemo-fastdecode serve")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "  port=8000\n      TCP port (0: any free port, printed at start)." in out
    assert "  limits.max_message_bytes=1048576\n" in out  # nested sections as section.option
    assert "defaults:" not in out
    assert "  clients=6\n      concurrent clients" in format_options(LoadtestConfig)


def test_a_misspelled_key_names_the_closest_valid_keys():
    with pytest.raises(SystemExit) as done:
        parse_config(ServeConfig, ["prot=9000"], "nemo-fastdecode serve")
    message = str(done.value.code)
    assert message.startswith("nemo-fastdecode serve: unknown option 'prot'; did you mean 'port'?")
    assert "Valid options: model, host, port," in message
    with pytest.raises(SystemExit, match="'limits.max_mesage_bytes'; did you mean 'limits.max_message_bytes'"):
        parse_config(ServeConfig, ["limits.max_mesage_bytes=1"], "nemo-fastdecode serve")
    assert (
        parse_config(ServeConfig, ["port=9000", "limits.max_message_bytes=4096"], "x").limits.max_message_bytes == 4096
    )
    # the Hydra scripts: decoding.* goes on to NeMo; Hydra's flags and hydra.* overrides are Hydra's
    assert unknown_keys(TranscribeConfig, ["decoding.beam.beam_size", "batch_size"], ("decoding",)) == []
    check_hydra_argv(TranscribeConfig, "t", ["--config-name", "other", "+decoding.x=1", "hydra.job.chdir=true", "-m"])
    with pytest.raises(SystemExit) as done:
        check_hydra_argv(ParallelTranscribeConfig, "t", ["++devces=2"])
    assert done.value.code == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_loadtest_without_a_server_fails_fast_and_says_so(capsys):
    from nemo_fastdecode.apps.loadtest.app import main

    url = f"ws://127.0.0.1:{_free_port()}/v1/realtime"
    start = time.monotonic()
    assert main([f"url={url}", "check=false"]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert f"no server at {url}" in err and "start it first with `nemo-fastdecode serve`" in err


def test_nemo_messages_become_one_line_each_once():
    dump = (
        "If you intend to do training or fine-tuning, please call the ModelPT.setup_training_data() method.\n"
        "Train config : \nmanifest_filepath: null\nsample_rate: 16000\n"
    )
    assert (
        one_line(dump)
        == "If you intend to do training or fine-tuning, please call the ModelPT.setup_training_data() method."
    )
    cuda = "No conditional node support for Cuda.\n    Cuda graphs with while loops are disabled\n    Reason: CUDA is not available"
    assert (
        one_line(cuda)
        == "No conditional node support for Cuda. Cuda graphs with while loops are disabled Reason: CUDA is not available"
    )
    warning = "/x/rnn.py:1011: UserWarning: dropout option adds dropout\n  super().__init__('LSTM', *args, **kwargs)\n"
    assert one_line(warning) == "/x/rnn.py:1011: UserWarning: dropout option adds dropout"
    logger = logging.getLogger("test_one_line_once")
    logger.propagate = False
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    logger.addFilter(OneLineOnce())
    for _ in range(2):
        logger.warning(cuda)
        logger.warning(dump)
    assert seen == [one_line(cuda), one_line(dump)]


def test_streaming_streams_every_input_by_default():
    assert StreamingConfig.num_streams is None and resolve_streaming({}).num_streams is None
    logged: list[str] = []
    assert stream_count(None, 20, logged.append) == 20 and not logged
    assert stream_count(6, 20, logged.append) == 6
    assert logged == ["num_streams=6: streaming the first 6 of 20 inputs (num_streams=null streams each input once)."]

# SPDX-License-Identifier: Apache-2.0
"""The library's lines in Python's logging (logger "pooler"), or in POOLER_LOG_DEST when that is
set; needs neither torch nor a GPU (pooler_log writes a line as the library does)."""

import logging
import os
import re
import subprocess
import sys
import uuid

import pytest

import pooler
from pooler import _abi, _library, _logging


def _write(level, text):
    _library.call("pooler_log", level, text.encode())


def test_lines_reach_the_pooler_logger_with_rank_and_pid(caplog):
    _library.library()  # loading it registers the callback
    if os.environ.get("POOLER_LOG_DEST"):
        pytest.skip("POOLER_LOG_DEST is set: the library writes there, nothing is routed")
    token = uuid.uuid4().hex
    with caplog.at_level(logging.DEBUG, logger="pooler"):
        _write(_abi.LOG_WARN, f"warned {token}")
        _write(_abi.LOG_ERROR, f"failed {token}")
    records = [record for record in caplog.records if token in record.getMessage()]
    assert [record.levelno for record in records] == [logging.WARNING, logging.ERROR]
    assert all(record.name == "pooler" for record in records)
    # Outside a Pooler's calls a line carries the process's rank: "-" until a Pooler is built, then
    # that Pooler's rank (the GPU tests may have built one in this process before this test runs;
    # a fresh process's "-" is checked in test_info_lines_and_the_min_level_from_pooler_log_level).
    rank = records[0].pooler_rank
    assert isinstance(rank, int) and rank >= -1
    shown = "-" if rank == -1 else str(rank)
    assert records[0].getMessage() == f"[rank {shown} pid {os.getpid()}] warned {token}"
    assert records[1].pooler_rank == rank


def test_the_logger_level_filters(caplog):
    _library.library()
    if os.environ.get("POOLER_LOG_DEST"):
        pytest.skip("POOLER_LOG_DEST is set")
    token = uuid.uuid4().hex
    with caplog.at_level(logging.ERROR, logger="pooler"):
        _write(_abi.LOG_WARN, f"dropped {token}")
    assert not [record for record in caplog.records if token in record.getMessage()]


def test_bad_levels_are_refused_naming_the_value():
    with pytest.raises(pooler.InvalidArgument, match="level is 6"):
        _write(_abi.LOG_OFF, "off is no level for a line")
    with pytest.raises(pooler.InvalidArgument, match="min_level is 9"):
        _library.call("pooler_set_log_callback", _logging._callback, None, 9)


def _child(code, **environment):
    """Runs `code` in a fresh Python with `environment` over this one's, without POOLER_LOG_DEST and
    POOLER_LOG_LEVEL unless given."""
    env = {k: v for k, v in os.environ.items() if k not in ("POOLER_LOG_DEST", "POOLER_LOG_LEVEL")}
    env.update(environment)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_info_lines_and_the_min_level_from_pooler_log_level():
    # A fresh process: no POOLER_LOG_LEVEL means every line from debug up reaches logging.
    code = ("import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.DEBUG, "
            "format='%(name)s %(levelname)s %(message)s'); import pooler; from pooler import _abi, _library; "
            "_library.call('pooler_log', _abi.LOG_DEBUG, b'seen at debug'); "
            "_library.call('pooler_log', _abi.LOG_INFO, b'seen at info')")
    result = _child(code)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^pooler DEBUG \[rank - pid \d+\] seen at debug$", result.stdout, re.M), result.stdout
    assert re.search(r"^pooler INFO \[rank - pid \d+\] seen at info$", result.stdout, re.M), result.stdout
    # POOLER_LOG_LEVEL=warn: the library hands over nothing below warn.
    result = _child(code, POOLER_LOG_LEVEL="warn")
    assert result.returncode == 0, result.stderr
    assert "seen at" not in result.stdout + result.stderr


def test_pooler_log_dest_is_used_instead_of_logging(tmp_path):
    token = uuid.uuid4().hex
    code = ("import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.DEBUG); import pooler; "
            "from pooler import _abi, _library; "
            f"_library.call('pooler_log', _abi.LOG_WARN, b'to the file {token}'); print('pid', __import__('os').getpid())")
    result = _child(code, POOLER_LOG_DEST=str(tmp_path / "pooler-%p.log"))
    assert result.returncode == 0, result.stderr
    assert token not in result.stdout + result.stderr  # not routed into logging, not on stderr
    pid = re.search(r"^pid (\d+)$", result.stdout, re.M).group(1)
    text = (tmp_path / f"pooler-{pid}.log").read_text()
    assert re.search(rf"\] \[pooler\] \[warning\] \[rank - pid {pid}\] to the file {token}$", text, re.M), text

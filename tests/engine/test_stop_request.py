"""The signal side of stopping: a flag, never an exception mid-step (but a second Ctrl-C)."""

import os
import signal

import pytest

from engine.preemption import Preempted, StopRequest


def _deliver(signum):
    os.kill(os.getpid(), signum)  # the handler runs before the next bytecode


def test_sigterm_and_ctrl_c_only_record_a_request():
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        request = StopRequest().install()
        try:
            _deliver(signum)
            assert request.agreed() and request.signum == signum
            assert Preempted(7, "ckpt-7", request.signum).exit_status == status
        finally:
            request.uninstall()
    # uninstall() puts back whatever handlers were there before.
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_second_ctrl_c_stops_at_once():
    request = StopRequest().install()
    try:
        _deliver(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            _deliver(signal.SIGINT)
    finally:
        request.uninstall()

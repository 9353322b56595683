"""benchmarks/common.py: the host record, best-of-N timing and the report every benchmark
writes."""

import json
import time

import jax
import jax.numpy as jnp

from benchmarks import common


def test_best_time_returns_the_result_and_orders_its_timings():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.1 * (len(calls) == 2))  # one slow timed call among three
        return jnp.arange(3) * 2

    out, times = common.best_time(fn, repeats=3)
    assert out.tolist() == [0, 2, 4] and len(calls) == 4  # the first call, then 3 timed
    # The median is a fast call, well under the slow one's 0.1 s on any machine (a few ms on a
    # GPU machine whose cores run other tests); the first call compiled.
    assert times['best_s'] <= times['median_s'] < 0.1
    assert times['first_call_s'] > times['best_s']


def test_the_report_names_the_host_and_reads_back(tmp_path):
    host = common.host()
    assert host['device'].startswith(f'{jax.default_backend()}:')
    assert host['cpu_count'] >= 1 and host['jax']
    path = tmp_path / 'deep' / 'report.json'
    common.write_report(path, {'figure': 1.5} | host)
    assert json.loads(path.read_text()) == json.loads(json.dumps({'figure': 1.5} | host))

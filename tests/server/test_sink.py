"""routes.AsyncSink: what the worker thread's events wake the event loop for."""

import asyncio
import threading

from spekula.server.routes import AsyncSink
from spekula.server.scheduler import Delta, Finished
from spekula.trace import RequestStats


def deliver(deltas: bool) -> tuple[list, int]:
    """Events sent from another thread, as the scheduler sends them; returns what the loop's queue received
    and how many callbacks the worker scheduled on the loop."""

    async def main():
        sink = AsyncSink(deltas=deltas)
        woken = 0
        call_soon = sink.loop.call_soon_threadsafe

        def counted(*args):
            nonlocal woken
            woken += 1
            return call_soon(*args)

        sink.loop.call_soon_threadsafe = counted
        events = [Delta("a"), Delta("b"), Finished("ab", "stop", RequestStats())]
        worker = threading.Thread(target=lambda: [sink(e) for e in events])
        worker.start()
        got = [await sink.queue.get()]
        while not isinstance(got[-1], Finished):
            got.append(await sink.queue.get())
        worker.join()
        return got, woken

    return asyncio.run(main())


def test_a_stream_gets_every_step_s_text_then_the_end():
    got, woken = deliver(deltas=True)
    assert [type(e).__name__ for e in got] == ["Delta", "Delta", "Finished"] and woken == 3
    assert "".join(e.text for e in got[:-1]) == got[-1].text


def test_a_whole_response_wakes_the_loop_only_for_its_end():
    got, woken = deliver(deltas=False)
    assert [type(e).__name__ for e in got] == ["Finished"] and got[0].text == "ab"
    assert woken == 1

"""When a round's phases run and their collectives go out: overlapped with backward, on the
caller's thread, or a whole step's rounds coalesced. Every rank issues its collectives in the
same order whatever the timing; that is this module's one job.

A task (Task) is a unit's part of a step, what the C++ Round of the unit runs (_rounds.round_of):
phases, each a function that computes from the previous phase's collectives and returns its own
requests (_comm.Sum, _comm.Gather), and finish, which writes the result."""

import torch


class Task:
    def __init__(self, index: int, phases, finish):
        assert phases, "a unit has a phase at least"
        self.index, self.phases, self.finish = index, phases, finish


class Scheduler:
    """The collective order of one state's rounds on one communicator."""

    def __init__(self, comm):
        self.comm = comm
        # Completed once every collective chained so far (a unit's second phase, issued from the
        # first one's callback) has been issued; a driver waits for it before issuing its own.
        self.chain = torch.futures.Future()
        self.chain.set_result(None)
        self._chained = False  # whether _in_turn ever chained a collective (blocking callers never do)
        self._held = []  # coalesce: this step's (round, future) so far, in unit order

    def drain(self) -> None:
        """Waits until every collective chained so far has been issued, those chained meanwhile
        by the ones it waited for included (a phase's next stage or phase is chained from the
        callback that issues the one before, ahead of the gate that callback then opens): what a
        driver does before it issues collectives of its own, so that theirs follow every
        chained one on every rank, whatever the timing."""
        while self._chained:
            chain = self.chain
            chain.wait()
            if self.chain is chain:
                return

    def run(self, task: Task):
        """Runs a unit's round alone, overlapped with the caller: its first phase's collectives
        issued now, on the caller's thread (DDP's autograd thread); each later phase run from the
        completion callback of the previous one's collectives, in its turn in the chain
        (_in_turn), and its collectives issued; finish once the last completed. So backward goes
        on while the collectives are under way, and they still go out in the same order on every
        rank. Returns a future set when finish has run, or with the first error (a collective's,
        a phase's or finish's)."""
        out = torch.futures.Future()

        def fail(e):
            if not out.done():
                out.set_exception(e)

        settle = None

        def end(f):
            try:
                f.wait()
                settle()
                task.finish()
                out.set_result(None)
            except Exception as e:  # noqa: BLE001 - handed on through the future
                fail(e)

        def issue(i):
            if i:
                settle()
            issued(i, *self.comm.issue(task.phases[i]()))

        def issued(i, fut, done, more):
            """Phase i's collectives under way: its next stage (int8 sums' integers), its next
            phase or finish, each in turn once they have completed."""
            nonlocal settle
            settle = done
            if more is not None:
                self._in_turn(fut.future, lambda: (done(), issued(i, *more())), fail)
            elif i + 1 == len(task.phases):
                fut.future.then(end)
            else:
                self._in_turn(fut.future, lambda: issue(i + 1), fail)

        issue(0)
        return out

    def now(self, rounds) -> None:
        """Runs rounds one after another on this thread, each to its end, for a caller that waits
        anyway (average(), FSDP's calls) and for the last bucket of a DDP step on the CPU
        (backward is over and DDP waits for it at once, so there is nothing to overlap, while
        gloo's callback thread, another core scheduled late on a busy machine, finds the matrices
        cold: a codec's apply is slower there; BENCHMARKS.md, the DDP hooks' own work). No
        futures: FSDP calls once per module where DDP calls once per bucket, so what a call costs
        beside the codec counts as many times (BENCHMARKS.md, a codec's work under FSDP). Each
        stretch of Python between two phases runs on caches the phase left cold (a torch call costs
        many times its warm cost there), so the stretches touch little: the collectives waited for
        as works (Pending), a unit's sums made once (_rounds.Core.sum_of). A round
        that fails does not stop the later ones (every rank issues their collectives); the first
        error is raised once all have run."""
        first = None
        for task in rounds:
            try:
                self._inline(task)
            except Exception as e:  # noqa: BLE001 - raised below, once every round has run
                if first is None:
                    first = e
        if first is not None:
            raise first

    def _inline(self, task: Task) -> None:
        """task's phases, their collectives and finish, on this thread; raises the first error."""
        for i, phase in enumerate(task.phases):
            if i:
                fut.wait()
                settle()
            fut, settle, more = self.comm.issue(phase())
            while more is not None:  # int8 sums: their integers once their scales are agreed
                fut.wait()
                settle()
                fut, settle, more = more()
        fut.wait()  # a failed collective's error, not a finish on what it left
        settle()
        task.finish()

    def _in_turn(self, after, issue, fail):
        """Calls issue() once `after` has completed and every issue chained before this one has
        run, on the thread that completes the last of them; fail(error) instead when `after`
        failed or issue raised. Drivers wait for the chain before they issue a collective of
        their own, so the collectives follow the order in which they were chained, which is the
        same on every rank (DDP calls the hook for its buckets in order). The chain goes on
        whatever happens."""
        self._chained = True
        turn, self.chain = self.chain, torch.futures.Future()
        gate = self.chain

        def run(_):
            try:
                after.wait()
                issue()
            except Exception as e:  # noqa: BLE001 - handed on through the unit's future
                fail(e)
            finally:
                gate.set_result(None)

        torch.futures.collect_all([turn, after]).then(run)

    def hold(self, rounds, last: bool):
        """Coalesced steps: keeps a call's rounds until the step's last call, which runs them all
        (_together). Returns their futures. A unit already held belongs to a step that never
        reached its last call (an error in between): that step's units fail and are dropped."""
        held = {task.index for task, _ in self._held}
        if any(task.index in held for task in rounds):
            stale, self._held = self._held, []
            for _, out in stale:
                out.set_exception(RuntimeError("sketchsgd hook: the step ended before its last bucket"))
        futures = [torch.futures.Future() for _ in rounds]
        self._held += zip(rounds, futures)
        if last:
            step, self._held = sorted(self._held, key=lambda h: h[0].index), []
            self._together(step)
        return futures

    def _together(self, held):
        """Runs the step's rounds (held: (round, future) in unit order) on this thread, the step's
        last call's: a phase's collectives of every unit laid end to end (Communicator.issue), so
        a step issues as many collectives as with the model in one bucket. A unit whose phase or
        finish raised drops out of the later phases (on every rank alike: the errors come from
        the sums and lengths every rank holds) and its future gets the error."""
        errors = {}
        flight, fut, settle = [], None, None  # the units whose collectives are under way

        def landed():
            """Waits for the collectives under way; a failed one fails every unit in it."""
            try:
                if fut is not None:
                    fut.wait()
                    settle()
            except Exception as e:  # noqa: BLE001 - handed on through the units' futures
                errors.update((task.index, e) for task, _ in flight)

        for i in range(max(len(task.phases) for task, _ in held)):
            landed()
            requests, flight = [], []
            for task, out in held:
                if task.index in errors or len(task.phases) <= i:
                    continue
                try:
                    requests += task.phases[i]()
                    flight.append((task, out))
                except Exception as e:  # noqa: BLE001 - handed on through the unit's future
                    errors[task.index] = e
            fut, settle, more = self.comm.issue(requests, flat=i) if requests else (None, None, None)
            while more is not None:  # int8 sums: their integers once their scales are agreed
                landed()
                if any(task.index in errors for task, _ in flight):  # the scales' collective failed
                    fut = None
                    break
                try:
                    fut, settle, more = more()
                except Exception as e:  # noqa: BLE001 - handed on through the units' futures
                    errors.update((task.index, e) for task, _ in flight)
                    fut = None
                    break
        landed()
        for task, out in held:
            if task.index not in errors:
                try:
                    task.finish()
                except Exception as e:  # noqa: BLE001 - handed on through the unit's future
                    errors[task.index] = e
            if task.index in errors:
                out.set_exception(errors[task.index])
            else:
                out.set_result(None)


def combined(futures, value):
    """A future of value once every future completed, or with the first one's error as it was
    raised (a then() callback would wrap it in a RuntimeError)."""
    out = torch.futures.Future()

    def result(_):
        try:
            for f in futures:
                f.value()
        except Exception as e:  # noqa: BLE001 - handed on through the future
            out.set_exception(e)
            return
        out.set_result(value)

    torch.futures.collect_all(futures).add_done_callback(result)
    return out

"""The operator console: the Django admin's workflow pages beyond plain model admin.

Every change goes through ``workflows.services`` or ``workflows.definitions``; this package
only validates what an operator typed, asks for confirmation and shows the outcome.

* ``actions``  — the run actions (force-complete, force-fail, retry, terminate, cancel,
  pause, resume, re-replay, signal): their forms and the service call behind each;
* ``views``    — the action confirmation pages, the dashboard, the dead-letter queue, the
  tenant switcher, the instance page and "state at step N";
* ``metrics``  — the dashboard's figures; ``charts`` — them drawn as SVG;
* ``replay``   — a run's query state as it was after its first N events;
* ``display``  — short texts (what a run waits on, ages) shared by the pages.

The event timeline is ``workflows.timeline``.
"""

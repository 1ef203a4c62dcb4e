"""Progress lines go to the `draftwise` loggers; a front end shows them for one block only."""

import logging

from draftwise.logs import LOGGER, progress_to


def test_progress_lines_reach_the_block_and_nothing_after_it():
    log = logging.getLogger("draftwise.optimize.auto")
    seen: list[str] = []
    before = (list(logging.getLogger(LOGGER).handlers), logging.getLogger(LOGGER).level)
    with progress_to(seen.append):
        log.info("measuring %s", "x")
        log.debug("not shown")
    log.info("after the block")
    assert seen == ["measuring x"]
    assert (list(logging.getLogger(LOGGER).handlers), logging.getLogger(LOGGER).level) == before


def test_no_sink_shows_nothing_and_a_failure_still_detaches_the_handler():
    seen: list[str] = []
    with progress_to(None):
        logging.getLogger("draftwise.models").info("quiet")
    try:
        with progress_to(seen.append):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    logging.getLogger("draftwise.models").info("later")
    assert seen == [] and logging.getLogger(LOGGER).handlers == []

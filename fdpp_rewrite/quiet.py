"""Third-party loggers held to what the user needs: our own one-line errors and tables say what went wrong, so
onnxruntime's, polygraphy's and onnx-graphsurgeon's notes and warnings (and polygraphy's "'colored' module is
not installed" on stdout) never reach the terminal. Their real failures still arrive, as exceptions."""

FATAL_ONLY = 4  # onnxruntime's severity levels: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal


def quiet_onnxruntime():
    """onnxruntime, its default logger set to fatal only (its errors come back as exceptions anyway)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(FATAL_ONLY)
    return ort


def session_options():
    options = quiet_onnxruntime().SessionOptions()
    options.log_severity_level = FATAL_ONLY
    return options


def quiet_polygraphy() -> None:
    from polygraphy.logger import G_LOGGER

    G_LOGGER.colors = False  # else its first message prints the 'colored' warning on stdout
    G_LOGGER.module_severity = G_LOGGER.CRITICAL + 1  # even critical: it raises PolygraphyException with the text


def quiet_graphsurgeon() -> None:
    from onnx_graphsurgeon.logger import G_LOGGER

    G_LOGGER.colors = False
    G_LOGGER.severity = G_LOGGER.ERROR

"""The Performance Explorer (`llmkern explore`): a self-contained interactive HTML page over a runs
database written by `llmkern optimize` - Pareto fronts, filters, side-by-side comparison, estimate
vs measured, and the `llmkern serve` command of each configuration.

    data.load(db_path) -> page data; page.render(data) -> HTML; browser: headless Chromium
    (DOM dumps, screenshots); serve.make_server: the page on loopback; cli: the command."""

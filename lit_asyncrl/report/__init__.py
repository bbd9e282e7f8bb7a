"""`lit-asyncrl report RUN_DIRS...`: figures and a markdown table over the runs of a sweep, with
mean and spread over seeds (see `lit_asyncrl.report.main`)."""

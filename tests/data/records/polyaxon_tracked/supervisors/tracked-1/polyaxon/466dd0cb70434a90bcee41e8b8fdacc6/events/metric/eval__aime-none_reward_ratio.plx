step|timestamp|metric
0|2026-12-07 13:37:44.204560+00:00|0.0
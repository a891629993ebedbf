"""Plan orchestration (`plan.plan`: every report section of one scenario), layout sweeps (`sweep`), the token
budget (`budget`), the serving search (`serve_search`) and error bands (`bands`). Nothing is imported here, so a
command reading one of them (decode reads `bands`) does not load the others."""

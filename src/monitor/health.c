/* Memory health levels: the one table of thresholds (fractions of the
 * budget) that the per-step log, the trace and the report share. */
#include "memfit/monitor.h"

static const struct { const char *name; double frac; } levels[MF_HEALTH_COUNT] = {
    [MF_HEALTH_OK] = {"ok", 0.0},
    [MF_HEALTH_NOTICE] = {"notice", 0.90},
    [MF_HEALTH_WARN] = {"warn", 0.92},
    [MF_HEALTH_HIGH] = {"high", 0.95},
    [MF_HEALTH_CRITICAL] = {"critical", 0.97},
};

double mf_health_threshold(mf_health h) {
    return (unsigned)h < MF_HEALTH_COUNT ? levels[h].frac : 0.0;
}

const char *mf_health_name(mf_health h) {
    return (unsigned)h < MF_HEALTH_COUNT ? levels[h].name : "?";
}

mf_health mf_health_level(size_t bytes, size_t budget) {
    if (budget == 0) return MF_HEALTH_OK;
    double frac = (double)bytes / (double)budget;
    mf_health h = MF_HEALTH_OK;
    for (int i = 1; i < MF_HEALTH_COUNT; i++)
        if (frac >= levels[i].frac) h = (mf_health)i;
    return h;
}

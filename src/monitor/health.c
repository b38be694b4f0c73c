/* Memory health levels: the one table of thresholds (fractions of the
 * budget) that the per-step log, the trace and the report share. */
#include "memfit/monitor.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[MF_HEALTH_COUNT] = {"ok", "target", "warning", "critical", "emergency"};
/* defaults: the seed guides' 90 / 92 / 95 / 97 % */
static double fracs[MF_HEALTH_COUNT] = {0.0, 0.90, 0.92, 0.95, 0.97};

double mf_health_threshold(mf_health h) {
    return (unsigned)h < MF_HEALTH_COUNT ? fracs[h] : 0.0;
}

const char *mf_health_name(mf_health h) {
    return (unsigned)h < MF_HEALTH_COUNT ? names[h] : "?";
}

mf_health mf_health_level(size_t bytes, size_t budget) {
    if (budget == 0) return MF_HEALTH_OK;
    double frac = (double)bytes / (double)budget;
    mf_health h = MF_HEALTH_OK;
    for (int i = 1; i < MF_HEALTH_COUNT; i++)
        if (frac >= fracs[i]) h = (mf_health)i;
    return h;
}

int mf_health_parse(const char *spec, double out[MF_HEALTH_COUNT - 1]) {
    double v[MF_HEALTH_COUNT - 1];
    const char *p = spec;
    for (int i = 0; i < MF_HEALTH_COUNT - 1; i++) {
        char *end;
        v[i] = strtod(p, &end);
        if (end == p || !(v[i] > 0 && v[i] <= 2) || (i && v[i] <= v[i - 1]) ||
            (i < MF_HEALTH_COUNT - 2 ? *end != ',' : *end != 0))
            return mf_fail("health_levels '%s': expected four increasing fractions of the budget in (0, 2], "
                           "e.g. 0.90,0.92,0.95,0.97 (target, warning, critical, emergency)", spec);
        p = end + 1;
    }
    if (out) memcpy(out, v, sizeof v);
    return 0;
}

int mf_health_configure(const char *spec) {
    double v[MF_HEALTH_COUNT - 1];
    if (mf_health_parse(spec, v)) return -1;
    memcpy(fracs + 1, v, sizeof v);
    return 0;
}

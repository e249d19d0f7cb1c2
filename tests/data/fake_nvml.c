/* A RECORDING STAND-IN for libnvidia-ml.so.1 (tests only: there is no GPU here). It implements the few NVML
 * calls chaoskit's agent makes, with NVML's own signatures and struct layouts (nvml.h), for two GPUs:
 *   - events come from the file named by $CHAOSKIT_FAKE_NVML_EVENTS, one per line, "INDEX TYPE DATA"
 *     (TYPE 8: Xid critical error with DATA the Xid; 2: double-bit ECC), each served once by nvmlEventSetWait_v2,
 *     which otherwise waits (polling the file) until its timeout and returns NVML_ERROR_TIMEOUT;
 *   - every call is appended to $CHAOSKIT_FAKE_NVML_CALLS, one name per line (the test reads what was asked).
 * Compiled by the test with gcc. */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct { int index; } fake_device;
typedef fake_device *nvmlDevice_t;
typedef struct { int registered; } fake_set;
typedef fake_set *nvmlEventSet_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

static fake_device devices[2] = {{0}, {1}};
static fake_set the_set;
static long served = 0; /* lines of the events file served so far */

static void record(const char *call) {
    const char *path = getenv("CHAOSKIT_FAKE_NVML_CALLS");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s\n", call);
    fclose(f);
}

nvmlReturn_t nvmlInit_v2(void) { record("nvmlInit_v2"); return 0; }
nvmlReturn_t nvmlShutdown(void) { record("nvmlShutdown"); return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == 10 ? "Timeout" : "Unknown Error"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { record("nvmlDeviceGetCount_v2"); *n = 2; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    record("nvmlDeviceGetHandleByIndex_v2");
    if (i > 1) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *d = &devices[i];
    return 0;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    record("nvmlDeviceGetPciInfo_v3");
    memset(p, 0, sizeof *p);
    p->domain = 0; p->bus = 0x18 + d->index; p->device = 0;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", 0x18 + d->index);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", 0x18 + d->index);
    return 0;
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *s) { record("nvmlEventSetCreate"); *s = &the_set; return 0; }
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t s) { record("nvmlEventSetFree"); return 0; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    record("nvmlDeviceGetSupportedEventTypes");
    *types = 0x1 | 0x2 | 0x8;
    return 0;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t s) {
    char line[64];
    snprintf(line, sizeof line, "nvmlDeviceRegisterEvents %d %llu", d->index, types);
    record(line);
    s->registered++;
    return 0;
}

static int next_event(nvmlEventData_t *data) {
    const char *path = getenv("CHAOSKIT_FAKE_NVML_EVENTS");
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[128];
    long n = 0;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (strchr(line, '\n') == NULL) break; /* a line still being written */
        if (n++ < served) continue;
        int index; unsigned long long type, value;
        if (sscanf(line, "%d %llu %llu", &index, &type, &value) == 3 && index >= 0 && index < 2) {
            memset(data, 0, sizeof *data);
            data->device = &devices[index];
            data->eventType = type;
            data->eventData = value;
            found = 1;
        }
        served = n;
        if (found) break;
    }
    fclose(f);
    return found;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t s, nvmlEventData_t *data, unsigned int timeoutms) {
    record("nvmlEventSetWait_v2");
    struct timespec step = {0, 10 * 1000 * 1000};
    for (unsigned int waited = 0;; waited += 10) {
        if (next_event(data)) return 0;
        if (waited >= timeoutms) return 10; /* NVML_ERROR_TIMEOUT */
        nanosleep(&step, NULL);
    }
}

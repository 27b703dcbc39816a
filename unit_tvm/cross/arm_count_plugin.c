/*
 * A qemu TCG plugin that counts the aarch64 instructions a program executes: all of them, and
 * the 8-bit dot-product / matrix-multiply instructions unit-tvm tensorizes with (sdot, udot,
 * usdot by vector and by element, smmla, ummla, usmmla), and the multiply-adds those perform.
 *
 * Built by unit_tvm.cross.arm_python with the host's gcc, loaded as
 *   qemu-aarch64 -plugin count.so,out=FILE ...
 * and writes "name count" lines to FILE when the program exits. Counters are added inline by
 * the translated code (no callback per instruction); the program must run one thread, as the
 * additions are not atomic.
 *
 * Only the few entry points of qemu's plugin API (version 1, qemu 7.x) used here are declared;
 * qemu resolves them when it loads the plugin.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t, void *);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, qemu_plugin_vcpu_tb_trans_cb_t);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op,
                                              void *, uint64_t);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *, enum qemu_plugin_op,
                                                void *, uint64_t);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, qemu_plugin_udata_cb_t, void *);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

/* One class of instruction: its encoding (bits under mask equal value), and the multiply-adds
 * one instruction performs with a 128-bit (Q=1) and a 64-bit (Q=0) destination. */
struct kind {
    const char *name;
    uint32_t mask, value;
    uint64_t macs_q1, macs_q0;
};

static const struct kind KINDS[] = {
    {"sdot", 0xBFE0FC00u, 0x0E809400u, 16, 8},       /* SDOT Vd.4S, Vn.16B, Vm.16B */
    {"udot", 0xBFE0FC00u, 0x2E809400u, 16, 8},
    {"usdot", 0xBFE0FC00u, 0x0E809C00u, 16, 8},
    {"sdot", 0xBFC0F400u, 0x0F80E000u, 16, 8},       /* SDOT Vd.4S, Vn.16B, Vm.4B[i] */
    {"udot", 0xBFC0F400u, 0x2F80E000u, 16, 8},
    {"usdot", 0xBFC0F400u, 0x0F80F000u, 16, 8},      /* USDOT / SUDOT by element */
    {"smmla", 0xFFE0FC00u, 0x4E80A400u, 32, 32},     /* SMMLA Vd.4S, Vn.16B, Vm.16B */
    {"ummla", 0xFFE0FC00u, 0x6E80A400u, 32, 32},
    {"usmmla", 0xFFE0FC00u, 0x4E80AC00u, 32, 32},
};
#define N_KINDS (sizeof(KINDS) / sizeof(KINDS[0]))

static uint64_t executed[N_KINDS];
static uint64_t macs[N_KINDS];
static uint64_t total;
static char out_path[4096];

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &total, n);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint32_t word;
        if (qemu_plugin_insn_size(insn) != 4)
            continue;
        memcpy(&word, qemu_plugin_insn_data(insn), 4);
        for (size_t k = 0; k < N_KINDS; k++) {
            if ((word & KINDS[k].mask) != KINDS[k].value)
                continue;
            qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64,
                                                       &executed[k], 1);
            qemu_plugin_register_vcpu_insn_exec_inline(
                insn, QEMU_PLUGIN_INLINE_ADD_U64, &macs[k],
                (word >> 30 & 1) ? KINDS[k].macs_q1 : KINDS[k].macs_q0);
            break;
        }
    }
}

static void on_exit(qemu_plugin_id_t id, void *unused)
{
    FILE *f = fopen(out_path, "w");
    if (f == NULL)
        return;
    fprintf(f, "instructions %llu\n", (unsigned long long)total);
    for (size_t k = 0; k < N_KINDS; k++)
        fprintf(f, "%s %llu\n%s.macs %llu\n", KINDS[k].name, (unsigned long long)executed[k],
                KINDS[k].name, (unsigned long long)macs[k]);
    fclose(f);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                               const qemu_info_t *info,
                                                               int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "out=", 4) == 0)
            snprintf(out_path, sizeof(out_path), "%s", argv[i] + 4);
    if (out_path[0] == '\0')
        return -1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, on_exit, NULL);
    return 0;
}

/* safetensors as a writer layout: the planned header is the only extent. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"

static void st_set_crc(ckptio_layout *l, size_t i, uint32_t crc) {
  ckptio_st_plan_set_crc(l->state, i, crc); /* the extent's bytes are the plan's header */
}

static void st_free(ckptio_layout *l) {
  ckptio_st_plan_free(l->state);
  free(l->state);
  free(l->extents);
}

int ckptio_st_layout(const ckptio_layout_input *in, size_t n, const ckptio_kv *meta, size_t nmeta,
                     int with_crc, uint64_t data_align, ckptio_layout *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  ckptio_st_plan *plan = calloc(1, sizeof(*plan));
  ckptio_st_input *sin = calloc(n + 1, sizeof(*sin));
  ckptio_st_kv *skv = calloc(nmeta + 1, sizeof(*skv));
  int rc = -ENOMEM;
  if (!plan || !sin || !skv) goto fail;
  for (size_t i = 0; i < n; i++)
    sin[i] = (ckptio_st_input){in[i].name, in[i].dtype, in[i].ndim, in[i].shape, in[i].nbytes};
  for (size_t i = 0; i < nmeta; i++) skv[i] = (ckptio_st_kv){(char *)meta[i].key, (char *)meta[i].value};
  if ((rc = ckptio_st_plan_make(sin, n, skv, nmeta, with_crc, data_align, plan, err, errlen)) < 0) goto fail;
  if (!(out->extents = calloc(1, sizeof(ckptio_extent)))) {
    rc = -ENOMEM;
    ckptio_st_plan_free(plan);
    goto fail;
  }
  out->extents[0] = (ckptio_extent){0, plan->header_bytes, plan->header, with_crc};
  out->nextents = 1;
  out->file_size = plan->file_size;
  out->count = plan->count;
  out->order = plan->order;
  out->offset = plan->offset;
  out->set_crc = with_crc ? st_set_crc : NULL;
  out->free = st_free;
  out->state = plan;
  free(sin);
  free(skv);
  return 0;
fail:
  free(plan);
  free(sin);
  free(skv);
  memset(out, 0, sizeof(*out));
  return rc;
}

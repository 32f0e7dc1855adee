# Copied from the team lead's shared/refs/ (see docs/contributing.md, "Tests"): defines torchvision's compiled op names so that
# torchvision's Python part, and timm, import on the CPU build of torch.
"""Lets timm import on a CPU-only torch: torchvision's CUDA wheel has no loadable _C, so define its op names."""
import torch
_lib = torch.library.Library("torchvision", "DEF")
_schemas = {
 "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
 "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
 "roi_align": "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
 "_roi_align_backward": "(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
 "ps_roi_align": "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)",
 "_ps_roi_align_backward": "(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
 "roi_pool": "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) -> (Tensor, Tensor)",
 "_roi_pool_backward": "(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
 "ps_roi_pool": "(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) -> (Tensor, Tensor)",
 "_ps_roi_pool_backward": "(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
 "deform_conv2d": "(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
 "_deform_conv2d_backward": "(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
}
for name, schema in _schemas.items():
    _lib.define(name + schema)

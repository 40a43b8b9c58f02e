// SPDX-License-Identifier: MIT
// (placeholder: filled by the RDMA transport)

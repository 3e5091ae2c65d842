//! The table gathers: the token embedding and the PLE n-gram embedding, whose table may be kept
//! on the host (`host_table`: the real release's 102 GB table beside the model on one GPU).

use super::super::{require, DeviceFacts, NodeFacts, Variant};

fn table_on_device(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(f.dim("host_table") == 0, || {
        "the n-gram table is on the host: its rows are gathered there (ple_embed's `host_gather`, \
         which needs the ple_embed fusion)"
            .into()
    })
}

fn table_on_host(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    require(f.dim("host_table") == 1, || {
        "the n-gram table is on the device: the `reference` kernel gathers it there".into()
    })
}

pub static EMBED: &[Variant] = &[Variant {
    op: "embed",
    name: "reference",
    doc: "a thread per gathered value",
    accepts: table_on_device,
    kernels: |f, _| vec![f.kernel("embed_reference")],
}];

pub static PLE_EMBED: &[Variant] = &[
    Variant {
        op: "ple_embed",
        name: "reference",
        doc: "the n-gram ids hashed and their rows gathered in one kernel",
        accepts: table_on_device,
        kernels: |f, _| vec![f.kernel("ple_embed")],
    },
    Variant {
        op: "ple_embed",
        name: "host_gather",
        doc: "the table on the host: the ids hashed and the rows gathered there before the step \
              (the step's tokens are the host's), then copied into the step from a buffer the \
              graph reads",
        accepts: table_on_host,
        kernels: |_, _| {
            vec![
                "host_ple_embed_gather".to_string(),
                "cuMemcpyHtoD".to_string(),
                "cuMemcpyDtoD".to_string(),
            ]
        },
    },
];

//! Generates the sidecar's gRPC service and messages from `proto/leasehold/v1` when the `grpc`
//! feature is on (with the encoded descriptors that server reflection serves).

fn main() {
    println!("cargo::rerun-if-changed=proto");
    #[cfg(feature = "grpc")]
    {
        let out =
            std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        tonic_prost_build::configure()
            .file_descriptor_set_path(out.join("leasehold_descriptor.bin"))
            .compile_protos(&["proto/leasehold/v1/leasehold.proto"], &["proto"])
            .unwrap_or_else(|error| {
                panic!("compiling proto/leasehold/v1/leasehold.proto: {error}")
            });
    }
}

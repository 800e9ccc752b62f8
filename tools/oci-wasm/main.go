// oci-wasm packages the filter's .wasm as the two OCI image variants that
// Istio's and Envoy Gateway's wasm fetchers (istio.io/istio/pkg/wasm and its
// copy in envoyproxy/gateway) accept, with no container engine, using
// go-containerregistry:
//
//   - compat: an ordinary OCI image with one application/vnd.oci.image.layer.v1.tar+gzip
//     layer holding plugin.wasm, and the annotation module.wasm.image/variant=compat
//     (solo-io/wasm spec-compat). Any OCI registry takes it.
//   - oci: the wasm artifact variant (solo-io/wasm spec): config
//     application/vnd.module.wasm.config.v1+json, and two layers, the runtime
//     configuration (application/vnd.module.wasm.config.v1+json) and the module
//     (application/vnd.module.wasm.content.layer.v1+wasm). Both fetchers refuse
//     this variant unless it has exactly two layers.
//
// Every byte is a function of the .wasm and the flags (no time stamps, fixed
// tar headers, fixed gzip header), so two builds give the same digests.
//
//	oci-wasm -wasm FILE -out DIR [-root-id ID] [-version V]
//
// writes DIR/compat and DIR/oci, each an OCI image layout holding one image
// (`crane push DIR/compat REF` pushes it), and prints one JSON object per
// variant: variant, digest, size (manifest + config + layers, bytes), and
// version when given. With -version, each manifest carries the annotation
// org.opencontainers.image.version=V (`crane manifest REF` shows it), so the
// version is part of the digest.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	wasmConfigMediaType  types.MediaType = "application/vnd.module.wasm.config.v1+json"
	wasmContentMediaType types.MediaType = "application/vnd.module.wasm.content.layer.v1+wasm"
	variantAnnotation                    = "module.wasm.image/variant"
	titleAnnotation                      = "org.opencontainers.image.title"
	refNameAnnotation                    = "org.opencontainers.image.ref.name"
	versionAnnotation                    = "org.opencontainers.image.version"
)

func main() {
	wasmPath := flag.String("wasm", "", "the .wasm to package (required)")
	outDir := flag.String("out", "", "output directory, replaced (required)")
	rootID := flag.String("root-id", "tenant_ratelimit", "root_id recorded in the oci variant's runtime configuration")
	version := flag.String("version", "", "the project's version, as each manifest's "+versionAnnotation+" annotation (none when empty)")
	flag.Parse()
	if *wasmPath == "" || *outDir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: oci-wasm -wasm FILE -out DIR [-root-id ID] [-version V]")
		os.Exit(2)
	}
	if err := run(*wasmPath, *outDir, *rootID, *version); err != nil {
		fmt.Fprintln(os.Stderr, "oci-wasm:", err)
		os.Exit(1)
	}
}

func run(wasmPath, outDir, rootID, version string) error {
	module, err := os.ReadFile(wasmPath)
	if err != nil {
		return err
	}
	if len(module) < 8 || !bytes.Equal(module[:4], []byte("\x00asm")) {
		return fmt.Errorf("%s: not a wasm module (no \\0asm magic)", wasmPath)
	}
	compat, err := compatImage(module, version)
	if err != nil {
		return fmt.Errorf("compat variant: %w", err)
	}
	oci, err := ociImage(module, rootID, version)
	if err != nil {
		return fmt.Errorf("oci variant: %w", err)
	}
	if err := os.RemoveAll(outDir); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	for _, v := range []struct {
		name string
		img  v1.Image
	}{{"compat", compat}, {"oci", oci}} {
		dir := filepath.Join(outDir, v.name)
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendImage(v.img, layout.WithAnnotations(map[string]string{refNameAnnotation: v.name})); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		digest, size, err := summary(v.img)
		if err != nil {
			return err
		}
		out := map[string]any{"variant": v.name, "layout": dir, "digest": digest.String(), "size": size}
		if version != "" {
			out["version"] = version
		}
		if err := enc.Encode(out); err != nil {
			return err
		}
	}
	return nil
}

// compatImage: one tar+gzip layer with plugin.wasm; the config is an
// ordinary (empty) OCI image configuration.
func compatImage(module []byte, version string) (v1.Image, error) {
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     "plugin.wasm",
		Mode:     0o644,
		Size:     int64(len(module)),
		ModTime:  time.Unix(0, 0),
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(module); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	// A gzip header without name or time: the same input gives the same bytes.
	var gzBuf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gzBuf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarBuf.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	gz := gzBuf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:       layer,
		Annotations: map[string]string{titleAnnotation: "plugin.wasm"},
	})
	if err != nil {
		return nil, err
	}
	annotations := map[string]string{variantAnnotation: "compat"}
	if version != "" {
		annotations[versionAnnotation] = version
	}
	annotated, ok := mutate.Annotations(img, annotations).(v1.Image)
	if !ok {
		return nil, fmt.Errorf("annotating the image did not give an image")
	}
	return annotated, nil
}

// ociImage: the wasm artifact variant, built from its raw parts because its
// config is not an image configuration.
func ociImage(module []byte, rootID, version string) (v1.Image, error) {
	runtimeConfig, err := json.Marshal(map[string]any{
		"type":        "envoy_proxy",
		"abiVersions": []string{"proxy_abi_version_0_2_1"},
		"config":      map[string]any{"rootIds": []string{rootID}},
	})
	if err != nil {
		return nil, err
	}
	configLayer := static.NewLayer(runtimeConfig, wasmConfigMediaType)
	wasmLayer := static.NewLayer(module, wasmContentMediaType)
	cfgDesc, err := partial.Descriptor(configLayer)
	if err != nil {
		return nil, err
	}
	wasmDesc, err := partial.Descriptor(wasmLayer)
	if err != nil {
		return nil, err
	}
	cfgDesc.Annotations = map[string]string{titleAnnotation: "runtime-config.json"}
	wasmDesc.Annotations = map[string]string{titleAnnotation: "plugin.wasm"}
	manifest := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config: v1.Descriptor{
			MediaType: wasmConfigMediaType,
			Size:      cfgDesc.Size,
			Digest:    cfgDesc.Digest,
		},
		Layers: []v1.Descriptor{*cfgDesc, *wasmDesc},
	}
	if version != "" {
		manifest.Annotations = map[string]string{versionAnnotation: version}
	}
	raw, err := json.Marshal(manifest)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&rawImage{
		manifest: raw,
		config:   runtimeConfig,
		layers:   map[v1.Hash]v1.Layer{cfgDesc.Digest: configLayer, wasmDesc.Digest: wasmLayer},
	})
}

// rawImage is a manifest, its config blob and its layers, as they are.
type rawImage struct {
	manifest []byte
	config   []byte
	layers   map[v1.Hash]v1.Layer
}

func (r *rawImage) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (r *rawImage) RawManifest() ([]byte, error)        { return r.manifest, nil }
func (r *rawImage) RawConfigFile() ([]byte, error)      { return r.config, nil }
func (r *rawImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if l, ok := r.layers[h]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("no blob %s in the image", h)
}

func summary(img v1.Image) (v1.Hash, int64, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, 0, err
	}
	m, err := img.Manifest()
	if err != nil {
		return v1.Hash{}, 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return v1.Hash{}, 0, err
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return digest, size, nil
}

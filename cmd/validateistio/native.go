// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/internal/packaging/manifest"
)

// nativeImage is the part of cmd/ociimage's -module summary (`make
// oci-native`, build/native-oci.json) the native manifests name.
type nativeImage struct {
	file        string
	Ref         string `json:"ref"`
	ImageDigest string `json:"image_digest"`
	Module      string `json:"module"`
}

func readNativeImage(p string) (*nativeImage, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("validateistio: -native-image: %w", err)
	}
	img := &nativeImage{file: p}
	if err := json.Unmarshal(b, img); err != nil {
		return nil, fmt.Errorf("validateistio: -native-image %s: %w", p, err)
	}
	if img.Ref == "" || !strings.HasPrefix(img.ImageDigest, "sha256:") || img.Module == "" {
		return nil, fmt.Errorf("validateistio: -native-image %s: want ref, image_digest and module (the summary of make oci-native), got %q, %q, %q",
			p, img.Ref, img.ImageDigest, img.Module)
	}
	return img, nil
}

// check returns an error for every image the istio-proxy of docs'
// Deployments loads the native module from that is not img pinned by its
// digest, and one when no Deployment loads the module from an image at
// all. The images are those of init containers that write the volume
// istio-proxy mounts at the folder its ENVOY_DYNAMIC_MODULES_SEARCH_PATH
// names (the examples' layout: the module's image copies the module into an
// emptyDir), and an image volume mounted there itself.
func (img *nativeImage) check(docs []manifest.Doc) []error {
	want := img.Ref + "@" + img.ImageDigest
	var errs []error
	found := 0
	for _, d := range docs {
		dep, ok := d.Obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		for _, m := range moduleImages(dep) {
			found++
			if m.ref != want {
				errs = append(errs, fmt.Errorf("%s (Deployment %s/%s): %s loads the native module from %q, want %q (the image of %s)",
					d, dep.Namespace, dep.Name, m.what, m.ref, want, img.file))
			}
		}
	}
	if found == 0 {
		errs = append(errs, fmt.Errorf("-native-image %s: no Deployment loads the native module from an image (an init container writing the volume istio-proxy loads it from, or an image volume)", img.file))
	}
	return errs
}

// moduleImage is one image a Deployment's istio-proxy gets the native
// module from.
type moduleImage struct {
	what string // "init container %q" or "image volume %q", for messages
	ref  string
}

// moduleImages returns the images d's istio-proxy gets the module from: for
// each volume it mounts at its module search path, the image of every init
// container (istio-proxy aside) that mounts that volume writable, or the
// volume's own image when it is an image volume. Pod volumes and mounts of
// the istio-proxy container count, and so do those Istio's injector adds
// from the sidecar.istio.io/userVolume and userVolumeMount annotations.
// Annotations that do not decode are left to package manifest, which
// reports them.
func moduleImages(d *appsv1.Deployment) []moduleImage {
	pod := &d.Spec.Template
	images := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.Image != nil {
			images[v.Name] = v.Image.Reference
		}
	}
	var vols map[string]corev1.VolumeSource
	if json.Unmarshal([]byte(pod.Annotations["sidecar.istio.io/userVolume"]), &vols) == nil {
		for name, v := range vols {
			if v.Image != nil {
				images[name] = v.Image.Reference
			}
		}
	}
	mounts := map[string]string{} // mount path: volume
	var searchPaths []string
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name != manifest.ProxyContainer {
			continue
		}
		for _, m := range c.VolumeMounts {
			mounts[path.Clean(m.MountPath)] = m.Name
		}
		for _, e := range c.Env {
			if e.Name == manifest.SearchPathEnv {
				searchPaths = append(searchPaths, e.Value)
			}
		}
	}
	var ms map[string]corev1.VolumeMount
	if json.Unmarshal([]byte(pod.Annotations["sidecar.istio.io/userVolumeMount"]), &ms) == nil {
		for name, m := range ms {
			mounts[path.Clean(m.MountPath)] = name
		}
	}
	var pc struct {
		ProxyMetadata map[string]string `json:"proxyMetadata"`
	}
	if yaml.Unmarshal([]byte(pod.Annotations["proxy.istio.io/config"]), &pc) == nil {
		if v, ok := pc.ProxyMetadata[manifest.SearchPathEnv]; ok {
			searchPaths = append(searchPaths, v)
		}
	}
	var out []moduleImage
	sort.Strings(searchPaths)
	seen := map[string]bool{}
	for _, dir := range searchPaths {
		name, ok := mounts[path.Clean(dir)]
		if !ok || seen[name] {
			continue
		}
		seen[name] = true
		if ref, ok := images[name]; ok {
			out = append(out, moduleImage{what: fmt.Sprintf("image volume %q", name), ref: ref})
		}
		for _, c := range pod.Spec.InitContainers {
			if c.Name == manifest.ProxyContainer {
				continue
			}
			for _, m := range c.VolumeMounts {
				if m.Name == name && !m.ReadOnly {
					out = append(out, moduleImage{what: fmt.Sprintf("init container %q (writing volume %q)", c.Name, name), ref: c.Image})
				}
			}
		}
	}
	return out
}

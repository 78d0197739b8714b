use burn::tensor::Tensor;
use hacpo::backend::Cpu;
fn main() {
    let dev = Default::default();
    let mut k = Tensor::<Cpu, 4>::zeros([64, 2, 512, 64], &dev);
    let t0 = std::time::Instant::now();
    for s in 0..100 {
        let new = Tensor::<Cpu, 4>::ones([64, 2, 1, 64], &dev);
        k = k.slice_assign([0..64, 0..2, s..s + 1, 0..64], new);
        let view = k.clone().slice([0..64, 0..2, 0..s + 1, 0..64]);
        drop(view);
    }
    println!("with view: {:?}", t0.elapsed());
    let t0 = std::time::Instant::now();
    for s in 0..100 {
        let new = Tensor::<Cpu, 4>::ones([64, 2, 1, 64], &dev);
        k = k.slice_assign([0..64, 0..2, s..s + 1, 0..64], new);
    }
    println!("no view: {:?}", t0.elapsed());
}
